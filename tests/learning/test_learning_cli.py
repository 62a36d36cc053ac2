"""``admin learning evidence`` and ``propose`` against a real controller holding the records of learning jobs:
divergent jobs set aside and counted, the challenger compared per size class, and a new version proposed only
when the evidence shows it better where it applies and never worse; no running job's pin changes."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.learning.learning_cluster import LEARNING, NODE, learning_cluster
from tests.learning.test_candidates import CHALLENGER_TABLE
from tests.learning.test_job_arm import SHARE
from tests.support.processes import TOKEN
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.config.cluster import LearningConfig
from topo_tune.plugin.timing_record import TIMING_MAGIC
from topo_tune.tuner.report.learning_evidence import evidence_section
from topo_tune.versions.version import TUNER_TABLE

LEARNING_ON = LearningConfig(enabled=True, explore_share=SHARE, timing_sample=4)


def record(*, rank: int, arm: int, ns: float, calls: int = 8) -> str:
    log = math.log(ns)
    return (
        f"{TIMING_MAGIC}\nprocess h{rank}:1 comm abc rank {rank} nranks 2 nnodes 1 sample 4 arm {arm}\n"
        f"unfinished 0 overflow 0\nallreduce 2097152 tree/ll128 {calls} 4 {int(4 * ns)} {int(ns)} {int(ns)} "
        f"{4 * log!r} {4 * log * log!r}\n"
    )


def admin_cli(address: str, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["admin", *args, "--controller", address], env={"TOPO_TUNE_TOKEN": TOKEN}, prog_name="topo-tune"
    )


def ship_jobs(address: str, count: int, *, prefix: str = "train", diverged: bool = True) -> dict[str, int]:
    """``count`` learning jobs, each shipping both ranks' records (a challenger job ~20 % faster at 2 MiB),
    and, when ``diverged``, one more whose ranks disagree; their arms."""
    arms = {}
    with AdminClient(address, token=TOKEN) as client:
        for i in range(count + diverged):
            job = f"{prefix}-{i}"
            pin = client.resolve_job_config(job, [NODE], may_learn=True).learning
            assert pin is not None, f"{job} learns"
            arm = pin.arm
            ns = (80_000.0 if arm else 100_000.0) * (1 + 0.01 * (i % 3))
            calls = 7 if i == count else 8
            client.record_job_timing(
                job, NODE, [record(rank=0, arm=arm, ns=ns), record(rank=1, arm=arm, ns=ns, calls=calls)]
            )
            arms[job] = arm
    return arms


async def test_evidence_then_a_proposal_that_goes_through_the_normal_rollout(sqlite_url: str, tmp_path: Path) -> None:
    async with learning_cluster(sqlite_url, tmp_path, learning=LEARNING_ON) as cluster:
        address = cluster.address
        refused = await asyncio.to_thread(admin_cli, address, "learning", "propose", LEARNING.id, "--arm", "1")
        assert refused.exit_code != 0 and "challenger 1 of" in refused.output and "not shown faster" in refused.output

        arms = await asyncio.to_thread(ship_jobs, address, 16)
        assert {arms[f"train-{i}"] for i in range(16)} == {0, 1}
        shown = await asyncio.to_thread(admin_cli, address, "learning", "evidence", LEARNING.id)
        assert shown.exit_code == 0, shown.output
        assert "1 set aside as divergent" in shown.output and "divergent: train-16: comm abc: rank 1" in shown.output
        assert "learning stopped by the controller: job train-16's ranks ran different choices" in shown.output
        assert "proposable challengers: 1" in shown.output
        data = json.loads(
            (await asyncio.to_thread(admin_cli, address, "learning", "evidence", LEARNING.id, "-o", "json")).stdout
        )
        (large,) = [c for c in data["cells"] if c["class_bytes"] == 2097152]
        assert large["applies"] and large["decision"] == "faster" and 1.2 < large["speedup"] < 1.3
        assert sum(data["jobs_by_arm"].values()) == 16, "the divergent jobs are not pooled"

        report = tmp_path / "report.html"
        report.write_text(f"<html><body><h1>init's page</h1>{evidence_section(None, version=LEARNING.id)}</body>")
        refreshed = await asyncio.to_thread(admin_cli, address, "learning", "evidence", LEARNING.id, "--report",
                                            str(report))  # fmt: skip
        assert refreshed.exit_code == 0 and "'What learning jobs showed'" in refreshed.stderr, refreshed.output
        page = report.read_text()
        assert page.startswith("<html><body><h1>init's page</h1>") and page.endswith("</body>")
        assert f"<code>{LEARNING.id}</code>" in page and "stopped by the controller: job train-16" in page
        assert "(1M, 2M]</td><td class='l'>yes</td>" in page and "Proposable: challenger 1." in page
        assert page.count("<!-- topo-tune: learning evidence -->") == 1
        not_a_report = tmp_path / "other.html"
        not_a_report.write_text("<html></html>")
        refused = await asyncio.to_thread(admin_cli, address, "learning", "evidence", LEARNING.id, "--report",
                                          str(not_a_report))  # fmt: skip
        assert refused.exit_code != 0 and "--report: not a topo-tune report" in refused.output
        assert not_a_report.read_text() == "<html></html>"

        unknown = await asyncio.to_thread(admin_cli, address, "learning", "evidence", "cv-ffffffffffffffff")
        assert unknown.exit_code != 0 and "no config version 'cv-ffffffffffffffff'" in unknown.output
        wrong = await asyncio.to_thread(admin_cli, address, "learning", "propose", LEARNING.id, "--arm", "2")
        assert wrong.exit_code != 0 and "carries 1 challengers, not 2" in wrong.output
        proposed = await asyncio.to_thread(
            admin_cli, address, "learning", "propose", LEARNING.id, "--arm", "1", "-o", "json"
        )
        assert proposed.exit_code == 0, proposed.output
        new = json.loads(proposed.stdout)["id"]
        with AdminClient(address, token=TOKEN) as client:
            stored = await asyncio.to_thread(client.get_config_version, new)
            assert dict(stored.files) == {"nccl.conf": LEARNING.files["nccl.conf"], TUNER_TABLE: CHALLENGER_TABLE}
            assert stored.provenance["learned_from"] == LEARNING.id and stored.provenance["learned_arm"] == "1"
            again = await asyncio.to_thread(client.resolve_job_config, "train-3", [NODE], may_learn=True)
            assert again.config_version == LEARNING.id and again.learning is not None, "pins stand"
            assert again.learning.arm == arms["train-3"], "pins stand"
            fresh = await asyncio.to_thread(client.resolve_job_config, "after-proposal", [NODE])
            assert fresh.config_version == LEARNING.id, "a proposal changes nothing until it is rolled out"


@pytest.mark.parametrize("arm", ["0", "5"])
def test_propose_refuses_an_arm_outside_the_challengers_before_asking(arm: str) -> None:
    result = admin_cli("127.0.0.1:1", "learning", "propose", "cv-0000000000000001", "--arm", arm)
    assert result.exit_code == 2 and "--arm" in result.output
