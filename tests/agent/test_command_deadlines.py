"""Absolute command deadlines and job cancels on the agent: real executors, real gloo workers where any run.

A benchmark command carries its deadline as an absolute time, so one re-sent after it starts no worker and
one re-sent late runs only for what is left; a command from an older controller (``deadline_s`` alone)
still runs for its relative deadline. A cancelled job starts no worker when its command arrives afterwards.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.processes import free_port
from tests.support.waiting import async_wait_until
from topo_tune.agent.command_executor import CommandExecutor
from topo_tune.agent.journal import Journal
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, plan_job
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import spec_to_proto


def _executor(tmp_path: Path) -> CommandExecutor:
    return CommandExecutor(journal=Journal(tmp_path / "journal.sqlite3"), node_name="n0", work_dir=tmp_path / "bench")


def _run(job_id: str, *, deadline_s: int, deadline_at: datetime | None) -> agent_pb2.Command:
    """Rank 0 of a two-node job, on n0: with no n1, it waits at the rendezvous until its deadline."""
    spec = plan_job(
        job_id=job_id,
        collective=Collective.ALL_REDUCE,
        sweep=SizeSweep(1024, 1024, 2),
        dtype=dtype_named("float32"),
        nodes=[JobNode("n0", "127.0.0.1", 1), JobNode("n1", "127.0.0.1", 1)],
        rendezvous_port=free_port(),
        env={},
        gpu_devices=False,
    )
    command = agent_pb2.Command(command_id=f"{job_id}-0", run_benchmark=spec_to_proto(spec), deadline_s=deadline_s)
    if deadline_at is not None:
        command.deadline_at.FromDatetime(deadline_at)
    return command


async def test_a_command_resent_past_its_deadline_starts_no_worker(tmp_path: Path) -> None:
    passed = datetime.now(UTC) - timedelta(seconds=1)
    result = await _executor(tmp_path).run(_run("late", deadline_s=600, deadline_at=passed))
    assert result.status == agent_pb2.COMMAND_STATUS_TIMED_OUT, result.message
    assert f"its deadline {passed.isoformat()} passed before it arrived; nothing was started" == result.message
    assert not (tmp_path / "bench" / "late").exists(), "no worker was started"


@pytest.mark.slow
@pytest.mark.parametrize("absolute", [True, False], ids=["resent-late", "older-controller"])
async def test_a_command_runs_for_what_is_left_of_its_deadline(tmp_path: Path, absolute: bool) -> None:
    # Re-sent late: 3 s of the job's 600 s are left. From an older controller: 3 s counted from here.
    left = datetime.now(UTC) + timedelta(seconds=3)
    command = _run("j", deadline_s=600, deadline_at=left) if absolute else _run("j", deadline_s=3, deadline_at=None)
    started = time.monotonic()
    result = await _executor(tmp_path).run(command)
    assert result.status == agent_pb2.COMMAND_STATUS_TIMED_OUT, result.message
    assert time.monotonic() - started < 60, "not a fresh 600 s deadline"
    [status] = result.node_benchmark.rank_status
    assert status.outcome == agent_pb2.RANK_OUTCOME_HUNG


async def test_a_job_cancelled_before_its_command_arrives_starts_no_worker(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    cancel = agent_pb2.Command(
        command_id="c-0", cancel_job=agent_pb2.CancelJob(job_id="j", reason="node n1 lost (no heartbeat)")
    )
    cancelled = await executor.run(cancel)
    assert cancelled.status == agent_pb2.COMMAND_STATUS_SUCCEEDED
    assert cancelled.message == "job j was not running here; it will not start"
    result = await executor.run(_run("j", deadline_s=600, deadline_at=None))
    assert result.status == agent_pb2.COMMAND_STATUS_FAILED
    assert result.message == "job j was cancelled before it started here: node n1 lost (no heartbeat)"
    assert not (tmp_path / "bench" / "j").exists(), "no worker was started"


@pytest.mark.slow
async def test_a_cancel_kills_the_running_jobs_workers_and_says_why(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    running = asyncio.create_task(executor.run(_run("j", deadline_s=600, deadline_at=None)))
    progress = tmp_path / "bench" / "j" / "rank-0" / "progress.jsonl"
    await async_wait_until(lambda: asyncio.to_thread(progress.exists), timeout=60, what="rank 0 to start")
    cancel = agent_pb2.Command(command_id="c-0", cancel_job=agent_pb2.CancelJob(job_id="j", reason="node n1 lost"))
    cancelled = await executor.run(cancel)
    assert cancelled.message == "job j cancelled: its workers were killed"
    result = await asyncio.wait_for(running, 30)
    assert result.status == agent_pb2.COMMAND_STATUS_FAILED
    assert result.message == "job j cancelled by the controller: node n1 lost"
    [status] = result.node_benchmark.rank_status
    assert status.message.endswith("the job was cancelled (node n1 lost)"), status.message
