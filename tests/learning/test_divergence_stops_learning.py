"""Divergence detected after the fact: when the ranks of one learning job turn out to have run different
choices for the same calls, the controller stops the version's learning (its kill switch, with an event naming
the job) and ``admin learning evidence`` says why; a rank's record still on its way is not a disagreement."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import sqlalchemy as sa

from tests.learning.learning_cluster import LEARNING, NODE, learning_cluster
from tests.learning.test_learning_cli import LEARNING_ON, admin_cli, record
from tests.support.processes import TOKEN
from topo_tune.client.admin import AdminClient
from topo_tune.controller.db.models import EventRow

DISAGREEMENT = "comm abc: rank 1 ran allreduce 2097152 tree/ll128 7 times, rank 0 8"


async def test_ranks_that_ran_different_choices_stop_the_versions_learning(database_url: str, tmp_path: Path) -> None:
    async with learning_cluster(database_url, tmp_path, learning=LEARNING_ON) as cluster:
        address = cluster.address

        async def learning_events() -> list[str]:
            query = sa.select(EventRow.message).where(EventRow.kind == "version.learning").order_by(EventRow.id)
            return await cluster.controller.services.db.read(lambda s: list(s.scalars(query)))

        with AdminClient(address, token=TOKEN) as client:
            pin = (await asyncio.to_thread(client.resolve_job_config, "split-0", [NODE], may_learn=True)).learning
            assert pin is not None, "learning is on: the job gets an arm"
            arm = pin.arm
            # Each node ships its own ranks when the job ends: rank 0's record first, alone.
            first = [record(rank=0, arm=arm, ns=100_000.0)]
            assert await asyncio.to_thread(client.record_job_timing, "split-0", NODE, first) == 1
            waiting = await asyncio.to_thread(client.learning_evidence, LEARNING.id)
            assert not waiting.learning_stopped, "a rank's record still on its way is no disagreement"
            assert waiting.divergent == ["split-0: comm abc: records from 1 of its 2 ranks"], "but not compared"

            second = [record(rank=1, arm=arm, ns=100_000.0, calls=7)]
            assert await asyncio.to_thread(client.record_job_timing, "split-0", NODE, second) == 1
            assert await asyncio.to_thread(client.record_job_timing, "split-0", NODE, second) == 0, "a retry"
            after = await asyncio.to_thread(client.resolve_job_config, "after-the-divergence", [NODE], may_learn=True)
            assert after.learning is None, "no new job of the version explores"

        assert await learning_events() == [
            f"learning stopped for {LEARNING.id} by the controller: job split-0's ranks ran different choices "
            f"({DISAGREEMENT})"
        ], "one event, naming the job, however often its records are retried"
        shown = await asyncio.to_thread(admin_cli, address, "learning", "evidence", LEARNING.id)
        assert shown.exit_code == 0, shown.output
        assert f"divergent: split-0: {DISAGREEMENT}" in shown.output
        assert (
            f"learning stopped by the controller: job split-0's ranks ran different choices ({DISAGREEMENT}): "
            "new jobs run the chosen table" in shown.output
        )
        data = json.loads(
            (await asyncio.to_thread(admin_cli, address, "learning", "evidence", LEARNING.id, "-o", "json")).stdout
        )
        assert data["learning_stopped"] and "job split-0" in data["learning_stopped_why"]
        version = await asyncio.to_thread(admin_cli, address, "config", "show", LEARNING.id)
        assert version.exit_code == 0, version.output
        assert "stopped (kill switch set) by the controller: job split-0's ranks ran different choices" in (
            " ".join(version.output.split())
        ), "the version's own page says why learning stopped"
        as_json = await asyncio.to_thread(admin_cli, address, "config", "show", LEARNING.id, "-o", "json")
        assert "job split-0" in json.loads(as_json.stdout)["learning_stopped_why"]

        allowed = await asyncio.to_thread(admin_cli, address, "learning", "version", LEARNING.id, "--on")
        assert allowed.exit_code == 0, allowed.output
        with AdminClient(address, token=TOKEN) as client:
            agreed = (await asyncio.to_thread(client.resolve_job_config, "agreed-0", [NODE], may_learn=True)).learning
            assert agreed is not None, "learning is on again: the job gets an arm"
            arm = agreed.arm
            for rank in (0, 1):  # ranks that agree, shipped one call each, leave learning on
                await asyncio.to_thread(
                    client.record_job_timing, "agreed-0", NODE, [record(rank=rank, arm=arm, ns=90_000.0)]
                )
            again = await asyncio.to_thread(client.learning_evidence, LEARNING.id)
        assert not again.learning_stopped and again.learning_stopped_why == ""
        assert again.divergent == [f"split-0: {DISAGREEMENT}"], "the divergent job stays set aside"
        shown = await asyncio.to_thread(admin_cli, address, "learning", "evidence", LEARNING.id)
        assert "learning allowed (kill switch not set)" in shown.output
