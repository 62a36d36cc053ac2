"""Fresh workers are forked from one pre-imported process per launcher, and behave as started ones do.

Real gloo workers on loopback: the forked worker runs in its own session with exactly its environment, dies with
the fork server (which dies with the launcher's process), a killed fork server costs its workers and nothing
after, and a fork server that cannot start (or whose imports initialised CUDA, which a forked child could not
use) leaves workers to start as new interpreters.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.benchmark.test_gloo_jobs import _spec as gloo_job
from tests.support.processes import process_gone
from tests.support.waiting import wait_until
from topo_tune.agent.bench.fork_server import ForkServer
from topo_tune.agent.bench.kept_workers import KeptWorkers
from topo_tune.agent.bench.launcher import Launcher
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.results import RankOutcome
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective

pytestmark = pytest.mark.slow


def _spec(job_id: str, env: dict[str, str] | None = None) -> BenchmarkSpec:
    return gloo_job(job_id, collective=Collective.ALL_REDUCE, nodes=("n0",), ranks_per_node=2, env=env, iters=2)


def _run(launcher: Launcher, spec: BenchmarkSpec, work_dir: Path) -> list[dict[str, object]]:
    """Run ``spec``; every rank finished; each rank's ``started`` record."""
    outcome = launcher.run(spec, node_name="n0", deadline_s=120, work_dir=work_dir)
    assert [s.outcome for s in outcome.statuses] == [RankOutcome.FINISHED] * 2, outcome.statuses
    return [
        json.loads((work_dir / spec.job_id / f"rank-{r}" / "progress.jsonl").read_text().splitlines()[0])
        for r in range(2)
    ]


def _status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return line.split()[1]
    raise AssertionError(f"no {field} for {pid}")


def test_fresh_workers_are_forked_in_sessions_of_their_own_with_exactly_their_environment(tmp_path: Path) -> None:
    launcher = Launcher(backend=Backend.GLOO, kept=KeptWorkers(max_sets=2))
    try:
        first = _run(launcher, _spec("fork-a", {"NCCL_DEBUG": "WARN"}), tmp_path)
        server = launcher._fork_server
        assert server is not None and server.pid is not None
        assert _status(server.pid, "PPid") == str(os.getpid())
        for record in first:  # kept idle now: alive, children of the fork server, each its own session leader
            pid = int(str(record["pid"]))
            assert _status(pid, "PPid") == str(server.pid)
            assert os.getsid(pid) == pid
            assert record["env_keys"] == sorted(launcher.worker_env(_spec("fork-a"), tmp_path)), record
        # Another environment: fresh workers again, from the same fork server.
        second = _run(launcher, _spec("fork-b", {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "lo"}), tmp_path)
        assert {r["pid"] for r in second}.isdisjoint({r["pid"] for r in first})
        assert launcher._fork_server is server and server.pid is not None
        for record in second:
            assert _status(int(str(record["pid"])), "PPid") == str(server.pid)
            assert "GLOO_SOCKET_IFNAME" in record["env_keys"] and "TOPO_TUNE_AGENT_SECRET" not in record["env_keys"]
    finally:
        launcher.stop()


def test_a_killed_fork_server_takes_its_workers_along_and_the_next_job_gets_a_new_one(tmp_path: Path) -> None:
    launcher = Launcher(backend=Backend.GLOO, kept=KeptWorkers(max_sets=2))
    try:
        kept = [int(str(r["pid"])) for r in _run(launcher, _spec("kill-a"), tmp_path)]
        server = launcher._fork_server
        assert server is not None and server.pid is not None
        old = server.pid
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: all(process_gone(p) for p in kept), timeout=30, what="the kept workers to die with it")
        # The same environment: the kept set is found dead, and fresh workers come from a new fork server.
        again = _run(launcher, _spec("kill-b"), tmp_path)
        assert server.pid is not None and server.pid != old
        assert {int(str(r["pid"])) for r in again}.isdisjoint(kept)
    finally:
        launcher.stop()
    assert server.pid is not None
    wait_until(lambda: process_gone(server.pid or 0), timeout=30, what="the fork server to end with the launcher")


_FORK_SERVER_FAILS = {
    "exits at once": "sys.exit(1)",
    # As if the imports had initialised CUDA (a child forked then could not use it): it must never say ready.
    "finds CUDA initialised": (
        "import torch; torch.cuda.is_initialized = lambda: True; i = sys.argv.index('-c'); code = sys.argv[i + 1]; "
        "sys.argv = ['-c', *sys.argv[i + 2 :]]; exec(compile(code, '<bootstrap>', 'exec'))"
    ),
}


@pytest.mark.parametrize("how", sorted(_FORK_SERVER_FAILS))
def test_a_fork_server_that_cannot_start_leaves_workers_to_start_as_new_interpreters(
    how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An interpreter that runs everything but the fork server as the real one does.
    python = tmp_path / "python"
    python.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"if any('serve_forks' in a for a in sys.argv): {_FORK_SERVER_FAILS[how]}\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
    )
    python.chmod(0o755)
    launcher = Launcher(backend=Backend.GLOO, python=str(python), kept=KeptWorkers(max_sets=0))
    try:
        records = _run(launcher, _spec("no-fork"), tmp_path / "work")
        assert launcher._fork_server is None, "a fork server that failed is not tried again"
        assert all(r["jobs_before"] == 0 for r in records)
        assert any("workers start as new interpreters from now on" in m for m in caplog.messages), caplog.messages
        if how == "finds CUDA initialised":  # it said why, once: a fork server that never said ready is not retried
            assert (tmp_path / "work" / "fork-server.log").read_text().count("initialised CUDA") == 1
    finally:
        launcher.stop()


def test_an_idle_fork_server_ends_and_the_next_fresh_worker_starts_a_new_one(tmp_path: Path) -> None:
    launcher = Launcher(backend=Backend.GLOO, kept=KeptWorkers(max_sets=0))
    server = ForkServer(python=sys.executable, spawn=launcher._on_spawner, idle_s=1.0)
    launcher._fork_server = server
    try:
        _run(launcher, _spec("idle-a"), tmp_path)
        first = server.pid
        assert first is not None
        wait_until(lambda: process_gone(first), timeout=30, what="the idle fork server to end")
        _run(launcher, _spec("idle-b"), tmp_path)
        assert launcher._fork_server is server and server.pid not in (None, first), "a new one, not interpreters"
    finally:
        launcher.stop()
