"""``kill -9`` of an agent during a benchmark: its workers die with it, the job ends naming the lost node, and
the agent started again on the same state takes the next job.

(``kill -9`` during an apply: ``tests/agent/test_config_store.py``, killed at each step of an apply and at
random moments, leaves the old or the new version whole.)
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
from tests.controller.test_benchmark_jobs_service import finished, request
from tests.faults.figures import record
from tests.support.processes import Daemon, process_gone
from tests.support.waiting import async_wait_until
from topo_tune.benchmark.job_record import JobStatus
from topo_tune.controller.server import Controller
from topo_tune.node_record import NodeState
from topo_tune.v1 import agent_pb2

pytestmark = [pytest.mark.faults, pytest.mark.slow]

EXPIRY_S = 1.5


def worker_pids(state: Path) -> list[int]:
    """The benchmark workers the agent started, from the first progress line each wrote."""
    pids = []
    for progress in state.glob("bench/*/rank-*/progress.jsonl"):
        lines = progress.read_text().splitlines()
        if lines:
            pids.append(int(json.loads(lines[0])["pid"]))
    return pids


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """The agent's state directory; should a worker outlive its agent (the test fails), not the test too."""
    yield tmp_path / "state"
    for pid in worker_pids(tmp_path / "state"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def gloo_agent(controller: Controller, tmp_path: Path, state: Path) -> Daemon:
    args = ["agent", "run", "--controller", f"127.0.0.1:{controller.port}", "--node-name", "gpu1"]
    args += ["--backend", "gloo", "--address", "127.0.0.1", "--state-dir", str(state)]
    args += ["--config-dir", str(tmp_path / "config"), "--reconnect-max", "1"]
    return Daemon(args, tmp_path / "agent.log").start()


async def test_an_agent_killed_mid_benchmark_takes_its_workers_along_and_resumes(tmp_path: Path, state: Path) -> None:
    settings = controller_settings(f"sqlite:///{tmp_path / 'c.db'}", heartbeat_expiry_s=EXPIRY_S)
    controller = Controller(settings)
    await controller.start()
    agent = gloo_agent(controller, tmp_path, state)
    try:

        async def ready() -> bool:
            return controller.registry.state_of("gpu1") is NodeState.READY

        await async_wait_until(ready, timeout=60, what="the agent to register")
        # Long enough that its workers are still busy for a minute when the agent dies.
        sizes = agent_pb2.SizeSweep(min_bytes=1 << 26, max_bytes=1 << 26, step_factor=2)
        job = await controller.jobs.start(request(["gpu1"], sizes=sizes, iters=10_000, deadline_s=300))

        async def started() -> list[int]:
            return worker_pids(state)

        workers = await async_wait_until(started, timeout=60, what="the job's workers to start")
        agent.kill()
        killed_at = time.monotonic()

        async def workers_gone() -> bool:
            return all(process_gone(pid) for pid in workers)

        await async_wait_until(workers_gone, timeout=3, what="the workers to die with their agent")
        ended = await finished(controller, job.job_id)
        assert ended.status == JobStatus.FAILED
        assert "node gpu1 lost" in ended.message, ended.message
        assert time.monotonic() - killed_at < EXPIRY_S + 15

        # The agent started again on the same state: registered again, it takes the next job and finishes it.
        agent = gloo_agent(controller, tmp_path, state)
        await async_wait_until(ready, timeout=60, what="the agent to register again")
        again = await controller.jobs.start(request(["gpu1"]))
        done = await finished(controller, again.job_id)
        assert done.status == JobStatus.SUCCEEDED, done.message
        jobs = {j.job_id: j.status for j in await controller.jobs.list()}
        assert jobs == {job.job_id: JobStatus.FAILED, again.job_id: JobStatus.SUCCEEDED}
        record("agent kill -9 mid-benchmark", faults=1, resumes=1, rows=len(jobs) + len(workers))
    finally:
        agent.kill()
        await controller.stop()
