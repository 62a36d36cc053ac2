"""``admin bench run`` waits on the controller's watch stream: it returns at the job's end and is idle until then.

Real controller and agent processes (sim backend) on loopback; the CLI runs in this process so that a gRPC
client interceptor sees every call it makes. One agent is held stopped (SIGSTOP) while the job is started,
so the CLI has a second or more to wait; its heartbeat expiry is long enough that it is not lost meanwhile.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from subprocess import PIPE
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from sqlalchemy.orm import Session

from tests.support.processes import TOKEN, LocalCluster, cli_env
from tests.support.waiting import wait_until
from topo_tune.benchmark.job_record import BenchmarkRequest, JobStatus, SizeRange
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.controller.db.models import CommandRow
from topo_tune.errors import ControllerUnavailable
from topo_tune.nccl.collectives import Collective

pytestmark = pytest.mark.slow

NODES = ("w-1", "w-2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("watch")
    local = LocalCluster(workdir=workdir, database_url=f"sqlite:///{workdir / 'topo-tune.db'}", heartbeat_expiry=60)
    try:
        local.start_controller()
        for name in NODES:
            local.start_agent(name)
        wait_until(lambda: ready(local) == set(NODES), what="two ready nodes")
        yield local
    finally:
        local.stop()
        print("\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in workdir.glob("*.log")))


def ready(cluster: LocalCluster) -> set[str]:
    result = cluster.admin("nodes", "-o", "json")
    return {n["name"] for n in json.loads(result.stdout) if n["state"] == "ready"} if result.returncode == 0 else set()


@dataclass
class Calls(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Every RPC the client starts (method, time), and every message a stream delivers (time)."""

    started: list[tuple[str, float]] = field(default_factory=list)
    streamed: list[float] = field(default_factory=list)

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        self.started.append((details.method.rsplit("/", 1)[-1], time.time()))
        return continuation(details, request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        self.started.append((details.method.rsplit("/", 1)[-1], time.time()))
        responses = continuation(details, request)

        def counted() -> Iterator[Any]:
            for response in responses:
                self.streamed.append(time.time())
                yield response

        return counted()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    seen = Calls()
    plain = grpc.insecure_channel
    monkeypatch.setattr(grpc, "insecure_channel", lambda *a, **k: grpc.intercept_channel(plain(*a, **k), seen))
    return seen


@dataclass(frozen=True)
class Waited:
    """One ``admin bench run`` that waited on a held node."""

    result: Result
    job_id: str
    latency_s: float
    """From the controller's commit of the job's last node result to the CLI's return (same clock)."""
    rpcs: list[str]
    streamed: int
    """Messages the watch stream delivered."""


def last_result_committed(cluster: LocalCluster, job_id: str) -> float:
    """When the controller recorded the job's last node result: its own clock (the time it stamps on the result's
    row, taken just before that row's transaction commits, so the latency measured from it is if anything longer)."""
    engine = sa.create_engine(cluster.database_url)
    try:
        with Session(engine) as session:
            query = sa.select(CommandRow.finished_at).where(
                CommandRow.job_id == job_id, CommandRow.kind == "run_benchmark"
            )
            times = list(session.scalars(query))
    finally:
        engine.dispose()
    assert len(times) == len(NODES) and all(times), f"every node's result of {job_id} is recorded: {times}"
    return max(t.timestamp() for t in times if t is not None)


def bench_run_waiting(cluster: LocalCluster, calls: Calls, *, hold_s: float) -> Waited:
    """``admin bench run`` on both nodes while w-2's agent is held stopped for ``hold_s`` after the CLI
    started waiting; the CLI runs in this process, its calls counted by ``calls``."""
    agent = cluster.agents["w-2"].process
    assert agent is not None
    calls.started.clear()
    calls.streamed.clear()
    out: list[tuple[Result, float]] = []

    def run() -> None:
        args = ["admin", "bench", "run", "--controller", cluster.address, "--nodes", ",".join(NODES)]
        result = CliRunner().invoke(cli, [*args, "-b", "1K", "-e", "64K"], env={"TOPO_TUNE_TOKEN": TOKEN})
        out.append((result, time.time()))

    os.kill(agent.pid, signal.SIGSTOP)  # the job waits for this node
    try:
        thread = threading.Thread(target=run)
        thread.start()
        wait_until(lambda: len(calls.started) >= 2, what="the watch")
        time.sleep(hold_s)  # the CLI waits; w-1 reports, w-2 cannot
        assert thread.is_alive(), "it waits for the job"
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    thread.join(60)
    ((result, returned_at),) = out
    assert result.exit_code == 0, result.output
    job_id = result.stderr.split("# job ", 1)[1].split()[0]
    committed = last_result_committed(cluster, job_id)
    assert calls.started[-1][1] < committed, "the watch was open before the last result came"
    return Waited(result, job_id, returned_at - committed, [m for m, _ in calls.started], len(calls.streamed))


def test_bench_run_returns_at_the_commit_of_the_last_result_and_sends_nothing_while_waiting(
    cluster: LocalCluster, calls: Calls
) -> None:
    runs = [bench_run_waiting(cluster, calls, hold_s=hold) for hold in (1.0, 0.3, 0.3)]
    first = runs[0]
    assert f"# job {first.job_id} on w-1, w-2: succeeded" in first.result.stdout
    assert "# 1/2 nodes reported" in first.result.stderr, "progress while it waited"
    for run in runs:
        # Structural: one call to start, one stream to wait; no call at all while the job ran.
        assert run.rpcs == ["StartBenchmark", "WatchBenchmark"]
        # The stream sent the state at its start and once per committed change (each node's part, the end).
        assert 2 <= run.streamed <= 1 + len(NODES), run.streamed
        assert run.latency_s >= 0
    # The median of three runs, so that one run slowed by a loaded machine does not decide (the benchmark
    # benchmarks/watch_latency.py prints the distribution). Polling every 0.5 s would take 250 ms on average.
    latencies = sorted(run.latency_s * 1000 for run in runs)
    assert latencies[1] < 100, f"bench run returned {latencies} ms after the job's last result was committed"


def running_jobs(cluster: LocalCluster) -> list[str]:
    with AdminClient(cluster.address, token=TOKEN) as client:
        return [j.job_id for j in client.list_benchmarks() if j.status is JobStatus.RUNNING]


def restart_controller(cluster: LocalCluster) -> None:
    assert cluster.controller is not None
    assert cluster.controller.terminate() == 0
    cluster.start_controller()


def test_a_wait_resumes_across_a_controller_restart_or_fails_in_one_line_when_it_does_not_come_back(
    cluster: LocalCluster,
) -> None:
    # w-2's agent is down (its node not yet lost): the job waits for it across a controller restart.
    cluster.agents["w-2"].kill()
    args = ["-m", "topo_tune", "admin", "bench", "run", "--controller", cluster.address, "--nodes", ",".join(NODES)]
    waiting = subprocess.Popen([sys.executable, *args], env=cli_env(), stdout=PIPE, stderr=PIPE, text=True)
    job_id = wait_until(lambda: running_jobs(cluster), what="the job to run")[0]
    restart_controller(cluster)  # the CLI's watch breaks while the job still runs
    cluster.start_agent("w-2")  # the job's command is sent to it when it registers
    stdout, stderr = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, stderr
    assert f"# job {job_id} on w-1, w-2: succeeded" in stdout, "the same job, followed to its end"
    assert f"lost the controller while waiting for benchmark job {job_id}" in stderr, "a broken wait says so"

    # A controller that does not come back within the window: one line naming the job and how to see it later.
    cluster.agents["w-2"].kill()
    try:
        with AdminClient(cluster.address, token=TOKEN, reconnect_s=1.0) as client:
            start = BenchmarkRequest(Collective.ALL_REDUCE, tuple(NODES), SizeRange(min_bytes=1024, max_bytes=65536))
            job_id = client.start_benchmark(start).job_id
            failed: list[BaseException] = []

            def wait() -> None:
                try:
                    client.wait_benchmark(job_id)
                except ControllerUnavailable as error:
                    failed.append(error)

            thread = threading.Thread(target=wait)
            thread.start()
            assert cluster.controller is not None
            cluster.controller.kill()
            thread.join(30)
        (error,) = failed
        assert f"lost the controller while waiting for benchmark job {job_id}" in str(error)
        assert f"topo-tune admin bench show {job_id}" in str(error) and "\n" not in str(error)
    finally:
        cluster.start_controller()
        cluster.start_agent("w-2")


def test_the_served_controller_runs_a_study_with_the_tuning_pass_it_was_given(cluster: LocalCluster) -> None:
    """``controller serve`` hands the controller the pass of ``topo-tune init``: a study runs to its end."""
    args = ["--id", "st-served", "--nodes", ",".join(NODES), "--collective", "all_gather", "--budget", "1"]
    args += ["--min-bytes", str(1 << 20), "--max-bytes", str(1 << 24), "--proof-pairs", "2", "--finalists", "1"]
    args += ["--wait", "--controller", cluster.address]
    waited = CliRunner().invoke(cli, ["admin", "study", "start", *args], env={"TOPO_TUNE_TOKEN": TOKEN})
    assert waited.exit_code == 0, waited.output
    assert "succeeded (SIMULATED)" in waited.stdout
    assert (cluster.workdir / "topo-tune-studies" / "st-served" / "summary.json").is_file()
