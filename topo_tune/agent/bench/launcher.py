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

Kept workers (``kept_workers``): a worker that finished a job says so on its reply pipe and waits for the next
one; where the launcher's ``KeptWorkers`` allow it (a job that succeeded here, whose environment names no
output file of its own), its set is kept for the next job with the same key, which then runs in it with
``HOME``, ``TMPDIR`` and the output directory of the set (``<work dir>/kept-workers-<key>/``), its rank
files still in the job's directory. Otherwise, and with ``KeptWorkers(max_sets=0)``, each job's workers end
with the job, as fresh ones would. Workers that may be kept are told the set's directory for their communicator
(``communicator_dir``), which they then keep too (``kept_communicator``), unless ``keep_communicators`` is off.

Fresh workers are forked from the launcher's fork server (``fork_server``: one process that imported torch and the
worker once), in milliseconds instead of the 1.3-2 s a new interpreter spends importing torch; what follows holds
for them too (their parent-death signal chains through the fork server). Where the fork server cannot start, a
worker is a new interpreter.

Each worker dies with the agent: its first line sets the parent-death signal (``prctl(PR_SET_PDEATHSIG,
SIGKILL)``; set after ``exec`` rather than in a ``preexec_fn``, which is unsafe in the threaded agent), so a
``kill -9`` of the agent leaves no worker busy. The signal follows the thread that started the worker, so
workers are started from one thread of the launcher's that lives as long as the launcher (a kept worker
outlives the job's thread). Each worker runs in its own session (``start_new_session``), so killing its
process group kills everything it started; every rank's group is killed when its worker ends, also a rank
that exited on its own (whatever it left running goes with it). The launcher waits on pidfds and reply pipes
for each rank's end of the job or the deadline; if a rank fails, the other local ranks are killed at once
(they would only wait for it). At the deadline every rank still running is killed and reported ``hung`` with
the last phase it reported. One job runs at a time; a second ``run`` while one is active raises
``LauncherBusy``.
``stop`` (the agent is stopping) kills the running job's ranks the same way, and every kept worker, and refuses
further jobs.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topo_tune.agent.bench.fork_server import ForkServer, ForkServerError
from topo_tune.agent.bench.job_dirs import prune_job_dirs
from topo_tune.agent.bench.kept_workers import KeptWorkers, WorkerProcess, WorkerSetKey, worker_set_key
from topo_tune.agent.bench.ranks_per_gpu import shared_gpu_env, worker_device
from topo_tune.agent.bench.worker_config import WorkerConfig, WorkerFault, per_job
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
    # in case the agent died before that took effect, a check that the parent is still the agent. The first
    # job's config gives the agent's sys.path; the jobs themselves come on stdin.
    "import ctypes, os, sys; ctypes.CDLL(None, use_errno=True).prctl(1, 9); "
    "os.getppid() == int(sys.argv[1]) or os._exit(70); "
    "import json; sys.path[:0] = json.load(open(sys.argv[3]))['sys_path']; "
    "from topo_tune.agent.bench.worker import serve; sys.exit(serve(int(sys.argv[2])))"
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
    """One rank of the job running now, and the process running it (fresh or kept)."""

    slot: RankSlot
    proc: WorkerProcess
    progress_path: Path
    result_path: Path
    stderr_path: Path
    returncode: int | None = None
    """This job's exit code: 0 once the worker said it finished the job (it lives on), else the process's."""
    killed: bool = False


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


def _pidfd(pid: int) -> int:
    """A descriptor readable once process ``pid`` ended; one that is readable now if it already has."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        done, closed = os.pipe()
        os.close(closed)  # end of file: readable at once
        return done


def _end_processes(processes: Sequence[WorkerProcess]) -> None:
    # The group, even when the rank itself already exited: a process it started (in its session)
    # would otherwise outlive the job, holding its port, memory or GPU.
    for p in processes:
        p.end()


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
        kept: KeptWorkers | None = None,
        fork_server: bool = True,
    ) -> None:
        """``fork_server``: fork fresh workers from a pre-imported process (``fork_server``)."""
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
        self._kept = kept or KeptWorkers(max_sets=0)
        # Workers are started from this one long-lived thread: the parent-death signal follows the thread that
        # started a process, and a kept worker outlives the job's thread.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{backend.value}-worker-spawner")
        self._fork_server = ForkServer(python=python, spawn=self._on_spawner) if fork_server else None

    @property
    def kept(self) -> KeptWorkers:
        """This launcher's idle worker sets."""
        return self._kept

    def worker_env(self, spec: BenchmarkSpec, work_dir: Path) -> dict[str, str]:
        """Exactly what a worker's environment holds (the same for every rank of the job).

        ``work_dir`` holds ``HOME``, ``TMPDIR`` and the output files: the job's directory, or a kept set's own.
        """
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
        job_dir_name: str = "",
    ) -> NodeOutcome:
        """Run this node's ranks of ``spec``; returns after all exit or the deadline passes. The ranks' directories
        go under ``work_dir / job_dir_name`` (default the job id); a kept set's home is ``work_dir``'s, whatever
        the job, so that a later job's spec finds the set."""
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
            return self._run(
                spec,
                node_name=node_name,
                deadline_s=deadline_s,
                work_dir=work_dir,
                fault=fault,
                job_dir_name=job_dir_name or spec.job_id,
            )
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
                    w.proc.kill_group()
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
                    w.proc.kill_group()
        self._kept.close()
        if self._fork_server is not None:
            self._fork_server.close()
        self._spawner.shutdown(wait=False)

    def _track(self, w: _Worker) -> _Worker:
        with self._stop_lock:
            self._started.append(w)
            if self._stopped or self._job_id in self._cancelled:
                w.proc.kill_group()
        return w

    def _set_key(self, spec: BenchmarkSpec, *, devices: Sequence[int], work_dir: Path) -> WorkerSetKey | None:
        """The key a kept set for this job's local ranks has, or None when this job's workers may not be kept."""
        if not self._kept.enabled:
            return None
        env = self.worker_env(spec, work_dir / "kept-workers")
        own_files = [k for k in EnvPolicy.output_files(env) if k not in DUMP_DEFAULTS]
        if own_files:
            return None  # NCCL opens them once per process: a kept worker would write the next job's there
        return worker_set_key(
            env=env,
            backend=self._backend,
            bind_address=self._bind_address,
            devices=devices,
            cpus=[self._cpus_for_device.get(d, ()) for d in devices],
            python=self._python,
        )

    def _run(
        self,
        spec: BenchmarkSpec,
        *,
        node_name: str,
        deadline_s: float,
        work_dir: Path,
        fault: WorkerFault | None,
        job_dir_name: str,
    ) -> NodeOutcome:
        deadline = self._clock() + deadline_s
        slots = spec.local_slots(node_name)
        if not slots:
            return NodeOutcome(results=(), statuses=(), timed_out=False)
        # Several agents may share a work directory (one per node in tests, a shared volume in
        # production), so only this node's rank directories are reset.
        job_dir = work_dir / job_dir_name
        prune_job_dirs(work_dir, now=time.time())  # older jobs' directories; never one a job may still use
        (job_dir / "tmp").mkdir(parents=True, exist_ok=True)
        (job_dir / OUTPUT_DIR).mkdir(exist_ok=True)
        devices = [worker_device(slot.device, self._ranks_per_gpu) for slot in slots]
        key = self._set_key(spec, devices=devices, work_dir=work_dir)
        home = job_dir if key is None else work_dir / f"kept-workers-{key}"
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        (home / OUTPUT_DIR).mkdir(exist_ok=True)
        os.utime(home)  # in use: job directory pruning goes by the last change
        env = self.worker_env(spec, home)
        job_env = {k: v for k, v in env.items() if per_job(k, self._backend)}
        kept = self._kept.take(key) if key is not None else None
        if kept is not None:
            logger.info("job %s: runs in kept workers %s", spec.job_id, [p.pid for p in kept])
        workers: list[_Worker] = []
        try:
            for i, slot in enumerate(slots):
                config = self._config(
                    spec,
                    slot=slot,
                    device=devices[i],
                    job_dir=job_dir,
                    deadline_s=deadline_s,
                    fault=fault,
                    env=job_env,
                    communicator_dir=home if key is not None and self._kept.keep_communicators else None,
                    last_job=key is None,
                )
                proc = kept[i] if kept is not None else self._spawn(spec, config=config, env=env, cwd=home)
                worker = _Worker(slot, proc, config.progress_path, config.result_path, config.stderr_path)
                workers.append(self._track(worker))
                proc.send(config.progress_path.with_name("config.json"))
            timed_out = self._wait(workers, deadline)
        except BaseException:
            for w in workers:
                self._kill(w)
            _end_processes(kept or [w.proc for w in workers])
            raise
        finally:
            with self._stop_lock:
                self._started = []
        for w in workers:
            if w.returncode is None:
                self._kill(w)
        with self._stop_lock:
            cancelled = self._cancelled.get(spec.job_id, "")
            stopped = self._stopped
        outcome = self._collect(workers, timed_out, spec.job_id, cancelled)
        clean = not (outcome.failed or timed_out or cancelled or stopped) and not any(r.wrong for r in outcome.results)
        processes = [w.proc for w in workers]
        if key is not None and clean:
            self._kept.keep(key, processes)
        else:
            _end_processes(processes)
        return outcome

    def _config(
        self,
        spec: BenchmarkSpec,
        *,
        slot: RankSlot,
        device: int,
        job_dir: Path,
        deadline_s: float,
        fault: WorkerFault | None,
        env: Mapping[str, str],
        communicator_dir: Path | None,
        last_job: bool,
    ) -> WorkerConfig:
        """Write rank ``slot``'s config file (in a fresh rank directory) and return it."""
        rank_dir = job_dir / f"rank-{slot.rank}"
        if rank_dir.exists():
            shutil.rmtree(rank_dir)  # a re-sent command starts from scratch
        rank_dir.mkdir()
        config = WorkerConfig(
            spec=spec,
            rank=slot.rank,
            device=device,
            backend=self._backend,
            bind_address=self._bind_address,
            rendezvous_timeout_s=deadline_s,
            progress_path=rank_dir / "progress.jsonl",
            result_path=rank_dir / "result.json",
            stderr_path=rank_dir / "stderr.log",
            # Absolute: the worker runs in the job directory, where relative entries would not resolve.
            sys_path=tuple(os.path.abspath(p) for p in sys.path if p),
            cpus=self._cpus_for_device.get(device, ()),
            fault=fault or WorkerFault(),
            job_env=dict(env),
            communicator_dir=communicator_dir,
            last_job=last_job,
        )
        config.dump(rank_dir / "config.json")
        return config

    def _on_spawner(self, start: Callable[[], Any]) -> Any:
        """Run ``start`` on the spawner thread (a process it starts dies with that thread); its result."""
        try:
            started = self._spawner.submit(start)
        except RuntimeError as exc:  # the spawner is shut down: stop() came first
            raise LauncherBusy("the agent is stopping: it takes no more benchmark jobs") from exc
        return started.result()

    def _spawn(self, spec: BenchmarkSpec, *, config: WorkerConfig, env: Mapping[str, str], cwd: Path) -> WorkerProcess:
        """Start a worker process that waits for its first job on stdin: forked from the fork server where there is
        one (a fork server that fails is not used again: workers then start as new interpreters)."""
        if self._fork_server is not None:
            try:
                forked, replies = self._fork_server.start_worker(
                    env=env, cwd=cwd, output=config.stderr_path, log=cwd.parent / "fork-server.log"
                )
            except ForkServerError as exc:
                logger.warning("job %s: %s; workers start as new interpreters from now on", spec.job_id, exc)
                self._fork_server.close()
                self._fork_server = None
            else:
                logger.info("job %s: forked rank %d (pid %d)", spec.job_id, config.rank, forked.pid)
                return WorkerProcess(forked, _pidfd(forked.pid), replies)
        replies, reply_end = os.pipe()
        try:
            with config.stderr_path.open("ab") as stderr:
                # Its output goes to this first job's file until it reads the job (then to each job's own).
                command = [self._python, "-E", "-s", "-c", _BOOTSTRAP, str(os.getpid()), str(reply_end)]
                command.append(str(config.progress_path.with_name("config.json")))
                process: subprocess.Popen[bytes] = self._on_spawner(
                    lambda: subprocess.Popen(
                        command,
                        env=dict(env),
                        cwd=cwd,
                        stdin=subprocess.PIPE,
                        stdout=stderr,
                        stderr=stderr,
                        start_new_session=True,
                        close_fds=True,
                        pass_fds=(reply_end,),
                    )
                )
        except BaseException:
            os.close(replies)
            raise
        finally:
            os.close(reply_end)
        logger.info("job %s: started rank %d (pid %d)", spec.job_id, config.rank, process.pid)
        return WorkerProcess(process, os.pidfd_open(process.pid), replies)

    def _wait(self, workers: Sequence[_Worker], deadline: float) -> bool:
        """Wait until every worker finished the job or exited (False) or the deadline passed (True)."""
        poller = select.poll()
        by_fd: dict[int, _Worker] = {}
        for w in workers:
            for fd in (w.proc.pidfd, w.proc.replies):
                by_fd[fd] = w
                poller.register(fd, select.POLLIN)
        while any(w.returncode is None for w in workers):
            remaining = deadline - self._clock()
            if remaining <= 0:
                return True
            for fd, _ in poller.poll(max(1, int(remaining * 1000))):
                w = by_fd[fd]
                if w.returncode is None and fd == w.proc.replies:
                    if not os.read(fd, 4096):
                        poller.unregister(fd)  # it exited: its pidfd says how
                        continue
                    w.returncode = 0
                    w.proc.jobs_run += 1
                elif w.returncode is None:
                    w.proc.returncode = w.proc.process.wait()
                    w.returncode = w.proc.returncode
                # Done with this job (also a rank killed below, whose pidfd fires next): no more events of it.
                for each in (w.proc.pidfd, w.proc.replies):
                    with contextlib.suppress(KeyError):
                        poller.unregister(each)
                if w.returncode != 0:
                    # The others would only wait for this rank until the deadline.
                    for other in workers:
                        if other.returncode is None:
                            self._kill(other)
        return False

    def _kill(self, w: _Worker) -> None:
        """End a rank that has not finished the job: kill its process group and reap it."""
        w.proc.kill_group()
        if w.returncode is not None:
            return
        w.killed = True
        if w.proc.returncode is None:
            w.proc.returncode = w.proc.process.wait()
        w.returncode = w.proc.returncode

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
