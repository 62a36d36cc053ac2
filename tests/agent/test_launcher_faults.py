"""Workers that misbehave: the launcher names the rank, leaves nothing running, and stays usable.

The workers here are small scripts standing in for the interpreter the launcher starts (its ``python``
argument), so each test runs in well under a second and no torch is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.support.processes import process_gone
from tests.support.waiting import wait_until
from topo_tune.agent.bench.launcher import Launcher
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.job_spec import BenchmarkSpec, RankSlot
from topo_tune.benchmark.results import RankOutcome
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective

# Stands in for ``python -E -s -c BOOTSTRAP CONFIG``: reads the config the launcher wrote, then acts on
# the behaviour file the test names (rank -> what to do).
_FAKE_PYTHON = """\
import json, os, signal, sys, time
config = json.load(open(sys.argv[-1]))
rank = config["rank"]
action = json.load(open(os.environ["FAKE_BEHAVIOUR"]))[str(rank)]
result = config["result_path"]
def write(r):
    json.dump({"job_id": config["spec"]["job_id"], "rank": r, "sizes": [], "effective_env": {}}, open(result, "w"))
if action == "garbage":
    open(result, "w").write("Segmentation fault (core dumped)\\n")
    sys.exit(0)
if action == "wrong_rank":
    write(rank + 7)
    sys.exit(0)
if action == "garbage_progress":
    open(config["progress_path"], "a").write('[1, 2]\\n"joined"\\n{"phase": "rendezvous", "waiting_for": "0"}\\n')
    print("cuda says no", file=sys.stderr)
    sys.exit(4)
if action == "ok":
    write(rank)
    sys.exit(0)
if action == "fork_and_fail":
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
        os._exit(0)
    open(os.path.join(os.path.dirname(result), "child.pid"), "w").write(str(child))
    sys.exit(1)
if action == "hang":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
"""


def _spec(job_id: str, world_size: int) -> BenchmarkSpec:
    return BenchmarkSpec(
        job_id=job_id,
        collective=Collective.ALL_REDUCE,
        sweep=SizeSweep(1024, 1024, 1),
        dtype=dtype_named("float32"),
        warmup_iters=0,
        iters=1,
        placements=(False,),
        check=True,
        env={},
        world_size=world_size,
        ranks=tuple(RankSlot(r, "n0", r, -1) for r in range(world_size)),
        rendezvous_host="127.0.0.1",
        rendezvous_port=29500,
    )


def _behave(tmp_path: Path, behaviour: dict[int, str]) -> None:
    (tmp_path / "behaviour.json").write_text(json.dumps({str(k): v for k, v in behaviour.items()}))


def _launcher(tmp_path: Path, behaviour: dict[int, str]) -> Launcher:
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\n{_FAKE_PYTHON}")
    fake.chmod(0o755)
    _behave(tmp_path, behaviour)
    # No fork server: the fake stands in for the new interpreter a worker is started as without one.
    return Launcher(
        backend=Backend.GLOO,
        python=str(fake),
        passthrough={"FAKE_BEHAVIOUR": str(tmp_path / "behaviour.json")},
        fork_server=False,
    )


def test_garbage_on_a_ranks_result_channel_fails_that_rank_by_name(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, {0: "garbage", 1: "ok", 2: "wrong_rank"})
    outcome = launcher.run(_spec("garbage-1", 3), node_name="n0", deadline_s=30, work_dir=tmp_path / "work")
    by_rank = {s.rank: s for s in outcome.statuses}
    assert by_rank[0].outcome is RankOutcome.FAILED
    assert "unreadable result file" in by_rank[0].message
    assert by_rank[1].outcome is RankOutcome.FINISHED
    assert by_rank[2].outcome is RankOutcome.FAILED
    assert "rank 9" in by_rank[2].message
    assert [r.rank for r in outcome.results] == [1]
    # Progress lines that are JSON but not the worker's records are passed over.
    _behave(tmp_path, {0: "garbage_progress"})
    outcome = launcher.run(_spec("garbage-2", 1), node_name="n0", deadline_s=30, work_dir=tmp_path / "work")
    [status] = outcome.statuses
    assert (status.outcome, status.phase, status.message) == (RankOutcome.FAILED, "rendezvous", "cuda says no")
    # The launcher is free for the next job.
    _behave(tmp_path, {0: "ok"})
    assert not launcher.run(_spec("garbage-3", 1), node_name="n0", deadline_s=30, work_dir=tmp_path / "work").failed


def test_a_rank_that_fails_leaves_no_process_of_its_group_running(tmp_path: Path) -> None:
    # Rank 0 exits 1 but leaves a child (in its process group) that ignores SIGTERM; rank 1 hangs.
    launcher = _launcher(tmp_path, {0: "fork_and_fail", 1: "hang"})
    outcome = launcher.run(_spec("orphan-1", 2), node_name="n0", deadline_s=30, work_dir=tmp_path / "work")
    assert [s.outcome for s in outcome.statuses] == [RankOutcome.FAILED, RankOutcome.FAILED]
    assert not outcome.timed_out, "the failed rank ended the job long before its deadline"
    child = int((tmp_path / "work" / "orphan-1" / "rank-0" / "child.pid").read_text())
    try:
        wait_until(lambda: process_gone(child), timeout=5, what=f"rank 0's child {child} killed with its group")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)  # a failing run must not leave it behind either


def test_a_job_run_prunes_old_job_directories_and_keeps_its_own(tmp_path: Path) -> None:
    work = tmp_path / "work"
    now = time.time()
    stale = work / "job-from-last-week"
    (stale / "rank-0").mkdir(parents=True)
    for path in (stale / "rank-0", stale):
        os.utime(path, (now - 7 * 86_400, now - 7 * 86_400))
    launcher = _launcher(tmp_path, {0: "ok"})
    assert not launcher.run(_spec("this-job", 1), node_name="n0", deadline_s=30, work_dir=work).failed
    assert not stale.exists()
    assert (work / "this-job" / "rank-0").is_dir(), "the job's own rank logs stay for the operator"
