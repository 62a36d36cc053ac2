"""Start one worker process per local rank, enforce the job's deadline, collect what they left.

Environment: a worker gets the job's variables (already checked by the env policy) on top of a
fixed base, and nothing else from the agent's environment:

- ``HOME`` and ``TMPDIR`` point into the job's work directory (torch and NCCL write small
  files there);
- every output-file variable (``NCCL_DEBUG_FILE``, dumps, torch's flight-recorder files, whose
  defaults are set here) is rewritten into ``<job dir>/out/`` (``EnvPolicy.confine``);
- ``PATH=/usr/bin:/bin`` (a fixed value, so any helper a library spawns resolves from system
  directories only);
- ``LANG=C.UTF-8`` and ``PYTHONUNBUFFERED=1``;
- the variables the *agent's own configuration* lists in ``passthrough`` (for example
  ``LD_LIBRARY_PATH`` on hosts whose driver libraries are not in the loader cache); the
  controller cannot add to that list;
- last, the node's ``node_env`` (the operator's ``agent run --worker-env``, e.g.
  ``NCCL_NVLS_ENABLE=0`` on hosts where NVLink multicast must stay off): it wins over the job's
  values, so no trial can switch off what the node requires.

The worker imports the same packages as the agent: the agent's ``sys.path`` travels in the
worker's config file, not in ``PYTHONPATH``.

Several ranks on one GPU (``ranks_per_gpu`` > 1, the agent's ``--ranks-per-gpu`` test and development mode, see
``ranks_per_gpu``): a rank the controller planned on device slot d runs on GPU d // N, and every worker gets
NCCL's multi-rank switch with its channels capped.

CPU placement: given ``cpus_for_device`` (GPU index -> its NUMA-local CPUs, from the node's
topology), each rank pins itself to its GPU's CPUs, as nccl-tests runs under ``mpirun --bind-to``;
on the H200 record, pinning was what made launch-bound timings comparable between processes.

Each worker dies with the agent: its first line sets the parent-death signal (``prctl(PR_SET_PDEATHSIG,
SIGKILL)``; set after ``exec`` rather than in a ``preexec_fn``, which is unsafe in the threaded agent), so a
``kill -9`` of the agent leaves no worker busy. The signal follows the thread that started the worker, which
lives as long as the job's ranks do (it waits for them). Each worker runs in its own session
(``start_new_session``), so killing its process group kills everything it started; every rank's group is
killed when the job ends, also a rank that exited on its own (whatever it left running goes with it). The
launcher waits on pidfds for the first exit or the deadline; if a rank fails, the other local ranks are
killed at once (they would only wait for it). At the deadline every rank still running is killed and
reported ``hung`` with the last phase it reported. One job runs at a time; a second ``run`` while one is
active raises ``LauncherBusy``.
``stop`` (the agent is stopping) kills the running job's ranks the same way and refuses further jobs.
``cancel`` (the controller ended the job: a node lost, a rank failed elsewhere) kills one job's ranks the same
way, reports them killed for that reason, and keeps that job from starting here later; the last
``CANCELLED_KEPT`` cancelled job ids are remembered.

Non-goals: the wire (``executor``), the environment policy (``topo_tune.benchmark.env_policy``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topo_tune.agent.bench.job_dirs import prune_job_dirs
from topo_tune.agent.bench.ranks_per_gpu import shared_gpu_env, worker_device
from topo_tune.agent.bench.worker_config import WorkerConfig, WorkerFault
from topo_tune.benchmark.env_policy import OUTPUT_DIR, EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec, RankSlot
from topo_tune.benchmark.results import RankOutcome, RankResult, RankStatus
from topo_tune.errors import JobCancelled, LauncherBusy
from topo_tune.nccl.backends import LAUNCHED_BACKENDS, Backend

__all__ = ["BASE_ENV", "CANCELLED_KEPT", "DUMP_DEFAULTS", "JobCancelled", "Launcher", "LauncherBusy", "NodeOutcome"]

logger = logging.getLogger(__name__)

BASE_ENV: Mapping[str, str] = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
DUMP_DEFAULTS: Mapping[str, str] = {
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "nccl_trace_rank_",
    "TORCH_FR_DUMP_TEMP_FILE": "nccl_trace_rank_",
}
"""Torch's dump files, named as torch names them but inside the job's output directory."""
_BOOTSTRAP = (
    # First the parent-death signal (prctl PR_SET_PDEATHSIG = 1, SIGKILL = 9), before the slow imports; then,
    # in case the agent died before that took effect, a check that the parent is still the agent.
    "import ctypes, os, sys; ctypes.CDLL(None, use_errno=True).prctl(1, 9); "
    "os.getppid() == int(sys.argv[1]) or os._exit(70); "
    "import json; sys.path[:0] = json.load(open(sys.argv[2]))['sys_path']; "
    "from topo_tune.agent.bench.worker import main; sys.exit(main(sys.argv[2:]))"
)
_STDERR_TAIL_BYTES = 2000
_JOINED_PHASES = frozenset({"joined", "running", "finished"})
CANCELLED_KEPT = 256
_REAP_WAIT_S = 30.0
"""How long ``cancel`` waits for the job's thread to reap its killed ranks (it takes milliseconds)."""
"""Cancelled job ids a launcher remembers, so that a job's command arriving after its cancel starts nothing."""


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """What one node's part of a job produced."""

    results: tuple[RankResult, ...]
    statuses: tuple[RankStatus, ...]
    timed_out: bool
    cancelled: str = ""
    """Why the controller cancelled the job while it ran here ("": it was not cancelled)."""

    @property
    def failed(self) -> bool:
        return any(s.outcome is not RankOutcome.FINISHED for s in self.statuses)

    @property
    def hung_ranks(self) -> tuple[int, ...]:
        return tuple(s.rank for s in self.statuses if s.outcome is RankOutcome.HUNG)


@dataclass
class _Worker:
    slot: RankSlot
    process: subprocess.Popen[bytes]
    pidfd: int
    progress_path: Path
    result_path: Path
    stderr_path: Path
    returncode: int | None = None
    killed: bool = False
    last: dict[str, Any] = field(default_factory=dict)


def _last_progress(path: Path) -> tuple[dict[str, Any], bool]:
    """The last progress record, and whether the rank ever reported joining."""
    last: dict[str, Any] = {}
    joined = False
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return last, joined
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the kill
        if not isinstance(record, dict):
            continue  # not one of the worker's records
        last = record
        joined = joined or record.get("phase") in _JOINED_PHASES
    return last, joined


def _read_result(w: _Worker, job_id: str) -> tuple[RankResult | None, str]:
    """The rank's result, or why what it left cannot be used ("" when it left none).

    A worker that exits 0 normally wrote its result atomically; anything else there (a library printing
    to the wrong file, a worker of another version) fails this rank alone, never the whole collection.
    """
    if not w.result_path.exists():
        return None, ""
    try:
        result = RankResult.from_json(json.loads(w.result_path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"unreadable result file {w.result_path.name}: {type(exc).__name__}: {exc}"
    if (result.job_id, result.rank) != (job_id, w.slot.rank):
        return None, f"result file is for job {result.job_id!r} rank {result.rank}, not this one"
    return result, ""


def _kill_group(w: _Worker) -> None:
    # The group id cannot be reused while any member is left, and an empty group is simply not found.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(w.process.pid, signal.SIGKILL)


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _STDERR_TAIL_BYTES))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


class Launcher:
    """Runs one node's ranks of one job at a time; safe to call from a worker thread."""

    def __init__(
        self,
        *,
        backend: Backend,
        bind_address: str = "127.0.0.1",
        passthrough: Mapping[str, str] | None = None,
        node_env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
        cpus_for_device: Mapping[int, Sequence[int]] | None = None,
        ranks_per_gpu: int = 1,
    ) -> None:
        if backend not in LAUNCHED_BACKENDS:
            known = " or ".join(repr(b.value) for b in LAUNCHED_BACKENDS)
            raise ValueError(f"backend must be {known}, got {backend!r}")
        self._backend = backend
        self._bind_address = bind_address
        self._passthrough = dict(passthrough or {})
        self._node_env = dict(node_env or {})
        self._python = python
        self._clock = clock
        # GPU index -> its NUMA-local CPUs (from the node's topology); ranks launch from there.
        self._cpus_for_device = {k: tuple(v) for k, v in (cpus_for_device or {}).items()}
        self._ranks_per_gpu = ranks_per_gpu if backend.runs_nccl else 1
        self._lock = threading.Lock()
        # stop() may come from another thread while run() starts or waits on workers.
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._started: list[_Worker] = []
        self._job_id = ""  # the job running now
        self._cancelled: OrderedDict[str, str] = OrderedDict()  # job id -> why

    def worker_env(self, spec: BenchmarkSpec, work_dir: Path) -> dict[str, str]:
        """Exactly what a worker's environment holds (the same for every rank of the job)."""
        env = {**BASE_ENV, "HOME": str(work_dir), "TMPDIR": str(work_dir / "tmp"), **self._passthrough}
        # Output files (debug logs, dumps) land in the job's directory, torch's flight-recorder dump too,
        # whose default is /tmp/nccl_trace_rank_<rank>.
        env.update(EnvPolicy.confine({**DUMP_DEFAULTS, **spec.env, **self._node_env}, work_dir))
        return shared_gpu_env(env, self._ranks_per_gpu)

    def run(
        self,
        spec: BenchmarkSpec,
        *,
        node_name: str,
        deadline_s: float,
        work_dir: Path,
        fault: WorkerFault | None = None,
    ) -> NodeOutcome:
        """Run this node's ranks of ``spec``; returns after all exit or the deadline passes."""
        if self._stopped:
            raise LauncherBusy("the agent is stopping: it takes no more benchmark jobs")
        if not self._lock.acquire(blocking=False):
            raise LauncherBusy("a benchmark job is already running on this node")
        try:
            with self._stop_lock:
                why = self._cancelled.get(spec.job_id)
                if why is not None:
                    raise JobCancelled(f"job {spec.job_id} was cancelled before it started here: {why}")
                self._job_id = spec.job_id
            return self._run(spec, node_name=node_name, deadline_s=deadline_s, work_dir=work_dir, fault=fault)
        finally:
            with self._stop_lock:
                self._job_id = ""
            self._lock.release()

    def cancel(self, job_id: str, reason: str) -> bool:
        """End job ``job_id`` here: kill its ranks with their groups, and start none of it later.

        Safe from any thread; the thread in ``run`` reaps the ranks and returns at once, each rank reported
        killed with ``reason``. True when the job was running here.
        """
        with self._stop_lock:
            self._cancelled[job_id] = reason
            self._cancelled.move_to_end(job_id)
            while len(self._cancelled) > CANCELLED_KEPT:
                self._cancelled.popitem(last=False)
            if self._job_id != job_id:
                return False
            for w in self._started:
                if w.returncode is None:
                    _kill_group(w)
        # Return once the job's thread has reaped its ranks: the node is then free for the next job.
        if self._lock.acquire(timeout=_REAP_WAIT_S):
            self._lock.release()
        return True

    def rebind(self, address: str) -> None:
        """Bind the next job's ranks to ``address`` (a running job's ranks were told theirs already)."""
        self._bind_address = address

    def stop(self) -> None:
        """Kill the running job's ranks with their groups and refuse further jobs: the agent is stopping.

        Ranks run in sessions of their own, so nothing else ends them with the agent; and the thread in
        ``run`` would hold the agent's process open until the job's deadline. Safe from any thread; that
        thread reaps the ranks and returns at once.
        """
        with self._stop_lock:
            self._stopped = True
            for w in self._started:
                if w.returncode is None:
                    _kill_group(w)

    def _track(self, w: _Worker) -> _Worker:
        with self._stop_lock:
            self._started.append(w)
            if self._stopped or self._job_id in self._cancelled:
                _kill_group(w)
        return w

    def _run(
        self,
        spec: BenchmarkSpec,
        *,
        node_name: str,
        deadline_s: float,
        work_dir: Path,
        fault: WorkerFault | None,
    ) -> NodeOutcome:
        deadline = self._clock() + deadline_s
        slots = spec.local_slots(node_name)
        if not slots:
            return NodeOutcome(results=(), statuses=(), timed_out=False)
        # Several agents may share a work directory (one per node in tests, a shared volume in
        # production), so only this node's rank directories are reset.
        job_dir = work_dir / spec.job_id
        prune_job_dirs(work_dir, now=time.time())  # older jobs' directories; never one a job may still use
        (job_dir / "tmp").mkdir(parents=True, exist_ok=True)
        (job_dir / OUTPUT_DIR).mkdir(exist_ok=True)
        env = self.worker_env(spec, job_dir)
        workers: list[_Worker] = []
        try:
            for slot in slots:
                workers.append(
                    self._track(
                        self._start(
                            spec,
                            slot=slot,
                            job_dir=job_dir,
                            env=env,
                            deadline_s=deadline_s,
                            fault=fault or WorkerFault(),
                        )
                    )
                )
            timed_out = self._wait(workers, deadline)
        finally:
            with self._stop_lock:
                self._started = []
            for w in workers:
                self._kill(w)
                os.close(w.pidfd)
        with self._stop_lock:
            cancelled = self._cancelled.get(spec.job_id, "")
        return self._collect(workers, timed_out, spec.job_id, cancelled)

    def _start(
        self,
        spec: BenchmarkSpec,
        *,
        slot: RankSlot,
        job_dir: Path,
        env: Mapping[str, str],
        deadline_s: float,
        fault: WorkerFault,
    ) -> _Worker:
        rank_dir = job_dir / f"rank-{slot.rank}"
        if rank_dir.exists():
            shutil.rmtree(rank_dir)  # a re-sent command starts from scratch
        rank_dir.mkdir()
        device = worker_device(slot.device, self._ranks_per_gpu)
        config = WorkerConfig(
            spec=spec,
            rank=slot.rank,
            device=device,
            backend=self._backend,
            bind_address=self._bind_address,
            rendezvous_timeout_s=deadline_s,
            progress_path=rank_dir / "progress.jsonl",
            result_path=rank_dir / "result.json",
            # Absolute: the worker runs in the job directory, where relative entries would not resolve.
            sys_path=tuple(os.path.abspath(p) for p in sys.path if p),
            cpus=self._cpus_for_device.get(device, ()),
            fault=fault,
        )
        config_path = rank_dir / "config.json"
        config.dump(config_path)
        stderr_path = rank_dir / "stderr.log"
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [self._python, "-E", "-s", "-c", _BOOTSTRAP, str(os.getpid()), str(config_path)],
                env=dict(env),
                cwd=job_dir,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                start_new_session=True,
                close_fds=True,
            )
        logger.info("job %s: started rank %d (pid %d)", spec.job_id, slot.rank, process.pid)
        return _Worker(slot, process, os.pidfd_open(process.pid), config.progress_path, config.result_path, stderr_path)

    def _wait(self, workers: Sequence[_Worker], deadline: float) -> bool:
        """Wait until every worker exited (False) or the deadline passed (True)."""
        poller = select.poll()
        by_fd = {w.pidfd: w for w in workers}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        running = len(workers)
        while running:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return True
            for fd, _ in poller.poll(max(1, int(remaining * 1000))):
                w = by_fd[fd]
                poller.unregister(fd)
                w.returncode = w.process.wait()
                running -= 1
                if w.returncode != 0:
                    # The others would only wait for this rank until the deadline.
                    for other in workers:
                        if other.returncode is None:
                            self._kill(other)
        return False

    def _kill(self, w: _Worker) -> None:
        # The group, even when the rank itself already exited: a process it started (in its session)
        # would otherwise outlive the job, holding its port, memory or GPU.
        _kill_group(w)
        if w.returncode is not None:
            return
        w.killed = True
        w.returncode = w.process.wait()

    def _collect(self, workers: Sequence[_Worker], timed_out: bool, job_id: str, cancelled: str) -> NodeOutcome:
        results = []
        statuses = []
        for w in workers:
            last, joined = _last_progress(w.progress_path)
            phase = str(last.get("phase", "not_started"))
            raw_waiting = last.get("waiting_for", ())
            waiting_for = tuple(r for r in raw_waiting if isinstance(r, int)) if isinstance(raw_waiting, list) else ()
            result, unreadable = _read_result(w, job_id) if w.returncode == 0 else (None, "")
            if result is not None:
                results.append(result)
                outcome, message = RankOutcome.FINISHED, ""
            elif unreadable:
                outcome, message = RankOutcome.FAILED, unreadable
            elif cancelled and (w.killed or w.returncode == -signal.SIGKILL):  # not a rank that failed by itself
                outcome, message = RankOutcome.FAILED, f"killed in phase {phase!r}: the job was cancelled ({cancelled})"
            elif w.killed and timed_out:
                outcome = RankOutcome.HUNG
                message = f"killed at the deadline in phase {phase!r}"
                if waiting_for:
                    message += f", waiting for ranks {list(waiting_for)} to join"
            elif w.killed:
                outcome, message = RankOutcome.FAILED, "killed because another local rank failed"
            else:
                outcome = RankOutcome.FAILED
                message = str(last.get("error") or _tail(w.stderr_path) or f"exit code {w.returncode}")
            statuses.append(
                RankStatus(
                    rank=w.slot.rank,
                    outcome=outcome,
                    phase=phase,
                    joined=joined,
                    exit_code=w.returncode,
                    message=message,
                    waiting_for=waiting_for,
                )
            )
        return NodeOutcome(results=tuple(results), statuses=tuple(statuses), timed_out=timed_out, cancelled=cancelled)
