"""A node lost mid-gate: the gate's benchmark job ends when the node's heartbeats expire, not at its deadline.

A real agent process (gloo: its benchmark workers are real processes too) is killed while its wave's gate
job runs; the in-process controller uses the test clusters' short heartbeat expiry, while the gate's jobs
keep their production deadline of ten minutes. The job must fail naming the lost node, and the gate become
inconclusive with that reason, as ``docs/rollout.md`` promises: the rollout pauses for a person.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import controller_settings
from tests.controller.rollout.test_gate_benchmarks import NEUTRAL, settled
from tests.support.processes import Daemon
from tests.support.waiting import async_wait_until
from topo_tune.benchmark.job_record import BenchmarkJob, JobStatus
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.rollout.gates import Outcome
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.controller.rollout.state import RolloutPhase
from topo_tune.controller.rollout.verification import BenchmarkVerifier
from topo_tune.controller.server import Controller
from topo_tune.node_record import NodeState

pytestmark = [pytest.mark.slow, pytest.mark.faults]

EXPIRY_S = 1.0


@pytest.fixture
def worker_reaper(tmp_path: Path) -> Iterator[None]:
    """Workers of a killed agent live on in their own sessions: end whatever the test left."""
    yield
    for progress in tmp_path.glob("state/bench/*/rank-*/progress.jsonl"):
        lines = progress.read_text().splitlines()
        if lines:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(json.loads(lines[0])["pid"]), signal.SIGKILL)


async def test_a_node_lost_mid_gate_ends_the_gate_inconclusive_within_a_heartbeat_expiry(
    sqlite_url: str, tmp_path: Path, worker_reaper: None
) -> None:
    controller = Controller(
        controller_settings(
            sqlite_url, rollout_interval_s=0.05, heartbeat_expiry_s=EXPIRY_S, agent_config_dir=tmp_path / "config"
        )
    )
    await controller.start()
    agent = Daemon(
        [
            "agent",
            "run",
            "--controller",
            f"127.0.0.1:{controller.port}",
            "--node-name",
            "gpu1",
            "--backend",
            "gloo",
            "--address",
            "127.0.0.1",
            "--state-dir",
            str(tmp_path / "state"),
            "--config-dir",
            str(tmp_path / "config"),
        ],
        tmp_path / "agent.log",
    ).start()
    try:
        assert isinstance(controller.rollouts.verifier, BenchmarkVerifier)
        verifier = controller.rollouts.verifier
        assert verifier.deadline_s == 600, "the gate's jobs keep the production deadline"

        async def ready() -> bool:
            return controller.registry.state_of("gpu1") is NodeState.READY

        await async_wait_until(ready, timeout=60, what="the agent to register")
        policy = PlanPolicy(canary_nodes=0, gate=RolloutGateConfig(repeats=4, min_bytes=1 << 10, max_bytes=1 << 16))
        created = await controller.rollouts.create(
            NEUTRAL, policy=policy, thresholds=RolloutThresholdsConfig(), actor="t"
        )

        async def gate_job_running() -> list[BenchmarkJob]:
            jobs = await controller.jobs.list()
            return [j for j in jobs if j.status == JobStatus.RUNNING]

        [job] = await async_wait_until(gate_job_running, timeout=60, what="the gate's first job")
        agent.kill()  # as an agent dies of a crash or an OOM kill: nothing tells the controller
        killed_at = time.monotonic()

        paused = await settled(controller, created.rollout.id, RolloutPhase.PAUSED)
        took = time.monotonic() - killed_at
        assert took < EXPIRY_S + 10, f"the gate ended {took:.1f} s after the kill: by the job's deadline?"
        [gate] = await controller.rollout_store.gates(created.rollout.id)
        assert gate.verdict.outcome is Outcome.INCONCLUSIVE, gate.verdict.reasons
        assert gate.verdict.lost_nodes == ("gpu1",)
        assert "lost nodes: gpu1" in paused.rollout.reason
        ended = await controller.jobs.get(job.job_id)
        assert ended.status == JobStatus.FAILED
        assert "node gpu1 lost (no heartbeat) while the job ran; cancelled on gpu1" in ended.message
    finally:
        agent.kill()
        await controller.stop()
