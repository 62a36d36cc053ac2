"""Drift checks measured by real benchmark jobs: a controller and a ``sim`` agent on loopback.

A version is rolled out and promoted (its gate stores the reference samples); the drift check re-runs the
gate's benchmark with the version's staged ``nccl.conf`` and finds the node as fast as then. The agent then
comes back on other hardware (a PCIe-only node instead of an NVSwitch one): the registration records the
changed topology fingerprint, and the next check measures the drop in bus bandwidth and reports it — over
the admin API as an operator sees it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from click.testing import CliRunner, Result

from tests.conftest import controller_settings
from tests.support.processes import TOKEN
from tests.support.sim_agent import sim_agent
from tests.support.waiting import async_wait_until
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.client.watch_step import WatchStep
from topo_tune.config.cluster import DriftConfig, RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.controller.rollout.state import RolloutPhase
from topo_tune.controller.rollout.verification import BenchmarkVerifier
from topo_tune.controller.server import Controller
from topo_tune.drift_record import DriftCheck
from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc
from topo_tune.versions.version import ConfigVersion, render_nccl_conf
from topo_tune.wire.drift_checks import drift_check_to_proto

pytestmark = pytest.mark.slow


def run_admin(controller: Controller, *args: str) -> Result:
    """``topo-tune admin ARGS`` against ``controller``, as an operator runs it."""
    address = f"127.0.0.1:{controller.port}"
    return CliRunner().invoke(cli, ["admin", *args, "--controller", address], env={"TOPO_TUNE_TOKEN": TOKEN})


NEUTRAL = ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_DEBUG": "WARN"})})


@pytest.fixture
async def controller(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Controller]:
    server = Controller(
        controller_settings(
            sqlite_url,
            rollout_interval_s=0.05,
            heartbeat_expiry_s=30,
            benchmark_result_grace_s=0.5,
            agent_config_dir=tmp_path / "config",
            drift=DriftConfig(sample_nodes=2, repeats=2, threshold=0.10),
        )
    )
    await server.start()
    assert isinstance(server.rollouts.verifier, BenchmarkVerifier)
    try:
        yield server
    finally:
        await server.stop()


async def test_drift_check_finds_the_version_as_fast_then_reports_a_slower_node(
    controller: Controller, tmp_path: Path
) -> None:
    async with sim_agent(controller.port, tmp_path, profile="h100-nvswitch"):
        snapshot = await controller.rollouts.create(
            NEUTRAL,
            policy=PlanPolicy(canary_nodes=0, gate=RolloutGateConfig(repeats=3)),
            thresholds=RolloutThresholdsConfig(),
            actor="t",
        )
        rollout_id = snapshot.rollout.id

        async def phase() -> RolloutPhase | None:
            current = (await controller.rollout_store.load(rollout_id)).rollout.phase
            return current if current in (RolloutPhase.PAUSED, RolloutPhase.COMPLETED) else None

        assert await async_wait_until(phase, timeout=60, what="the gate to pause") is RolloutPhase.PAUSED
        await controller.rollouts.promote(rollout_id, actor="operator")  # no gain shown: accepted by a person
        assert await async_wait_until(phase, timeout=60, what="completion") is RolloutPhase.COMPLETED

        async def on_version() -> bool:
            # A drift check samples only idle nodes: the version reported by a node still busy applying it
            # (on a loaded machine, its next heartbeat) would make the check skip.
            view = await controller.registry.get("gpu1")
            return view.applied_config_version == NEUTRAL.id and view.activity == "idle"

        await async_wait_until(on_version, timeout=30, what="gpu1 to report the version, idle")
        healthy = await controller.schedule.drift_check()
        assert healthy is not None and healthy.status == "ok", healthy
        assert healthy.simulated and "[simulated]" in healthy.message
        assert list(healthy.nodes) == ["gpu1"] and healthy.rollout_id == rollout_id
        for job_id in healthy.job_ids:  # stored like any benchmark job, measuring the staged version
            job = await controller.jobs.get(job_id)
            assert job.env["NCCL_CONF_FILE"] == str(tmp_path / "config" / "versions" / NEUTRAL.id / "nccl.conf")

        # An operator asks for a check now: the same code path, through the CLI. gpu1 reports itself idle
        # again after the first check's jobs only with its next heartbeat.
        await async_wait_until(on_version, timeout=30, what="gpu1 idle again after the first check")
        asked = await asyncio.to_thread(run_admin, controller, "drift", "run", "--version", NEUTRAL.id, "-o", "json")
        assert asked.exit_code == 0, asked.output
        requested = json.loads(asked.stdout)
        assert requested["status"] == "ok" and requested["check_id"] != healthy.check_id, requested
        assert requested["nodes"] == ["gpu1"] and len(requested["job_ids"]) == 2
        with AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as client:  # a check that has ended
            updates: list[WatchStep[DriftCheck]] = []
            watched = await asyncio.to_thread(client.watch_drift_check, requested["check_id"], updates.append)
        assert watched.status == "ok" and [(u.done, u.total) for u in updates] == [(2, 2)]
        wrong = await asyncio.to_thread(run_admin, controller, "drift", "run", "--version", "cv-0000000000000000")
        assert wrong.exit_code == 1
        assert f"error: --version: cv-0000000000000000 is not the active version ({NEUTRAL.id})" in wrong.output

    async with sim_agent(controller.port, tmp_path, profile="pcie"):  # the same node back on PCIe-only hardware
        await async_wait_until(on_version, timeout=30, what="gpu1 to register again")
        slower = await controller.schedule.drift_check()
        assert slower is not None and slower.status == "regressed", slower
        assert slower.measured_busbw_gbps < 0.9 * slower.reference_busbw_gbps

        # As above: the node reports itself idle after the first check's jobs only with its next heartbeat; a
        # check run before then skips the busy node (seen in CI on a loaded machine).
        await async_wait_until(on_version, timeout=30, what="gpu1 idle again after the check")
        again = await asyncio.to_thread(run_admin, controller, "drift", "run")
        assert again.exit_code == 1, "a regression fails the command"
        lines = again.stdout.splitlines()
        assert lines[0].startswith("drift check dc-")
        assert any(line.split()[:2] == ["status", "regressed"] for line in lines)
        [p_row] = [line.split() for line in lines if line.startswith("p-value")]
        assert float(p_row[1]) < 0.05 and p_row[2:] == ["(alpha", "0.05)"]
        assert "regressed: bus bandwidth" in again.output

    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        listed = await admin.ListDriftChecks(admin_pb2.ListDriftChecksRequest(), metadata=bearer_metadata(TOKEN))
        assert [(c.kind, c.status) for c in listed.checks] == [
            ("benchmark", "regressed"),
            ("benchmark", "regressed"),
            ("topology", "changed"),
            ("benchmark", "ok"),
            ("benchmark", "ok"),
        ]
        shown = await admin.GetDriftCheck(
            admin_pb2.GetDriftCheckRequest(check_id=slower.check_id), metadata=bearer_metadata(TOKEN)
        )
        assert shown == drift_check_to_proto(slower), "the stored check, as the admin API shows it"
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await admin.GetDriftCheck(
                admin_pb2.GetDriftCheckRequest(check_id="dc-404"), metadata=bearer_metadata(TOKEN)
            )
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await admin.ListDriftChecks(
                admin_pb2.ListDriftChecksRequest(status="maybe"), metadata=bearer_metadata(TOKEN)
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "status" in (bad.value.details() or "")
