"""A node whose config disk is full: every apply fails with the path and why, shown by ``rollout status`` and
``admin nodes``; the agent logs one line per attempt and no traceback; no half-written version is left or
activated; once space returns, the next attempt applies the version.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.rollout.test_gate_benchmarks import NEUTRAL, gate_controller
from tests.faults.figures import record
from tests.support.processes import Daemon, run_cli
from tests.support.tmpfs import SmallDisk, small_disk
from tests.support.waiting import async_wait_until
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.node_record import NodeState

pytestmark = pytest.mark.faults

NO_SPACE = "No space left on device"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with small_disk(tmp_path / "config", size_bytes=256 << 10) as mounted:
        yield mounted


async def test_a_full_config_disk_fails_each_apply_with_its_path_and_recovers(tmp_path: Path, disk: SmallDisk) -> None:
    controller = gate_controller(f"sqlite:///{tmp_path / 'c.db'}", disk.root)
    await controller.start()
    controller.rollouts.retry_after_s = 0.3  # attempts come quickly, and keep coming while the disk is full
    controller.rollouts.max_attempts = 1000
    address = f"127.0.0.1:{controller.port}"
    args = ["agent", "run", "--controller", address, "--node-name", "n1", "--backend", "sim", "--rack", "r1"]
    args += ["--state-dir", str(tmp_path / "state"), "--config-dir", str(disk.root)]
    agent = Daemon(args, tmp_path / "agent.log").start()
    try:

        async def ready() -> bool:
            return controller.registry.state_of("n1") is NodeState.READY

        await async_wait_until(ready, timeout=60, what="the agent to register")
        await asyncio.to_thread(disk.fill)
        policy = PlanPolicy(canary_nodes=0, gate=RolloutGateConfig(repeats=7))
        created = await controller.rollouts.create(
            NEUTRAL, policy=policy, thresholds=RolloutThresholdsConfig(), actor="t"
        )
        rollout_id = created.rollout.id

        async def shown() -> str:
            done = await asyncio.to_thread(run_cli, "admin", "rollout", "status", rollout_id, "--controller", address)
            return done.stdout if NO_SPACE in done.stdout else ""

        status = await async_wait_until(shown, timeout=60, what="rollout status to show why n1 has not applied")
        assert "n1" in status and "applying" in status and str(disk.root) in status, status
        listed = await asyncio.to_thread(run_cli, "admin", "nodes", "--controller", address, "-o", "json")
        [node] = json.loads(listed.stdout)
        assert NO_SPACE in node["config_apply_error"] and str(disk.root) in node["config_apply_error"], node
        assert node["applied_config_version"] == "", "nothing half-written was activated"

        async def attempts() -> bool:  # a few more attempts fail while the disk stays full
            commands = await controller.commands.list(node_name="n1")
            return sum(1 for c in commands if c.kind == "apply_config" and c.status.value == "failed") >= 4

        await async_wait_until(attempts, timeout=60, what="the apply to be retried")
        staging = list(disk.root.glob("versions/.staging-*"))
        assert staging == [], "a failed apply leaves no staging directory"
        assert not (disk.root / "active").exists()

        disk.free()

        async def applied() -> bool:
            view = controller.registry.live_report("n1")
            return view is not None and view.applied_config_version == NEUTRAL.id

        await async_wait_until(applied, timeout=60, what="the version to be applied once space returned")
        log = agent.output()
        failures = [line for line in log.splitlines() if "not applied" in line and NO_SPACE in line]
        commands = [c for c in await controller.commands.list(node_name="n1") if c.kind == "apply_config"]
        failed = [c for c in commands if c.status.value == "failed"]
        assert len(failures) == len(failed) >= 4, "one log line per failed attempt"
        assert "Traceback" not in log
        assert (disk.root / "active" / "nccl.conf").read_text() == NEUTRAL.files["nccl.conf"]
        record("agent config disk full", faults=1, resumes=1, rows=len(commands))
    finally:
        agent.kill()
        await controller.stop()
