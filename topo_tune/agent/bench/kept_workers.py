"""Benchmark worker processes kept across jobs, so a job need not pay for process start, torch and CUDA again.

NCCL reads its environment once per process, and the tuner plugin reads its table (and opens its record) once
per communicator. So a worker that finished a job can run the next one if that job's worker environment is the
same apart from the per-communicator variables (``PER_COMMUNICATOR_ENV``, sent with each job; on gloo every
``NCCL_*`` variable too, which gloo never reads), on the same
backend, bind address, devices and CPUs: the :func:`worker_set_key`, a content hash of all of these. Every job
still makes its own rendezvous; a kept process also keeps its communicator (process group) for a job of the
same membership where every rank of that job kept the same one (``kept_communicator``, ``keep_communicators``),
and otherwise makes a new one with its peers. Ranks on other nodes need not know whether a process was kept:
an agent that restarted and lost its workers simply starts fresh ones, and its peers' kept workers meet them at
the job's rendezvous and make a new communicator with them.

:class:`KeptWorkers` holds the idle sets of one launcher, by key:

- at most ``max_sets`` idle sets; keeping one more evicts (kills) the least recently used;
- a set idle for ``idle_s`` is killed (by a reaper thread that runs while any set is idle);
- a set is only kept when every process of it is alive and at most ``max_rss_bytes`` resident;
- :meth:`KeptWorkers.close` (the agent is stopping) kills every idle set and keeps none after.

The launcher decides what may be kept at all: only a job that succeeded everywhere on this node (no rank failed,
timed out, was cancelled or found a wrong element), and no job whose environment names an output file of its own
(that file belongs in the job's directory, and NCCL opens it once per process).

Non-goals: starting workers and running jobs (``launcher``), the worker's side of the protocol (``worker``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NewType

from topo_tune.agent.bench.fork_server import ForkedProcess
from topo_tune.agent.bench.worker_config import PER_COMMUNICATOR_ENV, per_job
from topo_tune.nccl.backends import Backend

__all__ = [
    "DEFAULT_IDLE_S",
    "DEFAULT_MAX_RSS_BYTES",
    "DEFAULT_MAX_SETS",
    "KeptWorkers",
    "WorkerProcess",
    "WorkerSetKey",
    "worker_set_key",
]

logger = logging.getLogger(__name__)

WorkerSetKey = NewType("WorkerSetKey", str)
"""The content hash of everything a kept worker process must share with the job it is to run."""

DEFAULT_MAX_SETS = 4
"""Four: the proof's interleaved A/B pairs rotate over the baseline's environment and each finalist's (three by
default, ``search.finalists``); with fewer sets kept than that, least-recently-used eviction kills the set the
next pair needs, every pair."""
DEFAULT_IDLE_S = 300.0
DEFAULT_MAX_RSS_BYTES = 4 << 30
"""Far above a worker's few hundred MB (torch and its CUDA context); a worker past it leaks and is not reused."""


def worker_set_key(
    *,
    env: Mapping[str, str],
    backend: Backend,
    bind_address: str,
    devices: Sequence[int],
    cpus: Sequence[Sequence[int]],
    python: str,
) -> WorkerSetKey:
    """The key of a set of local workers: jobs with the same key may run in the same processes.

    ``env`` is the worker environment as the launcher builds it; the values of ``PER_COMMUNICATOR_ENV`` are left
    out (each job sends its own), their presence is not; on gloo every ``NCCL_*`` variable is left out, value and
    presence (each job sends its own set: :func:`per_job`). ``devices`` and ``cpus`` are per local worker, in order.
    """
    shared = {
        k: ("" if k in PER_COMMUNICATOR_ENV else v)
        for k, v in env.items()
        if backend is not Backend.GLOO or not per_job(k, backend)
    }
    text = json.dumps(
        {
            "env": shared,
            "backend": backend.value,
            "bind_address": bind_address,
            "devices": list(devices),
            "cpus": [list(c) for c in cpus],
            "python": python,
        },
        sort_keys=True,
    )
    return WorkerSetKey(hashlib.sha256(text.encode()).hexdigest()[:24])


@dataclass
class WorkerProcess:
    """One worker process; it runs the jobs whose config paths it reads, one per line, from its stdin."""

    process: subprocess.Popen[bytes] | ForkedProcess
    pidfd: int
    """Readable once the process exited."""
    replies: int
    """Read end of the pipe the worker writes one line to after each job it finished."""
    jobs_run: int = 0
    returncode: int | None = None
    _closed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, config_path: Path) -> None:
        """Give the worker its next job; a worker that already died is seen exiting by the launcher."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.process.stdin.write(f"{config_path}\n".encode())
            self.process.stdin.flush()

    def rss_bytes(self) -> int:
        """Resident memory now (0 when the process is gone)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return 0

    def kill_group(self) -> None:
        """SIGKILL the worker's process group (it runs in a session of its own); never waits."""
        # The group id cannot be reused while any member is left, and an empty group is simply not found.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def end(self) -> None:
        """Kill the group, reap the process and close its descriptors (idempotent)."""
        self.kill_group()
        if self.returncode is None:
            self.returncode = self.process.wait()
        if not self._closed:
            self._closed = True
            if self.process.stdin is not None:
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            os.close(self.pidfd)
            os.close(self.replies)


@dataclass
class _IdleSet:
    workers: list[WorkerProcess]
    since: float


class KeptWorkers:
    """The idle worker sets of one launcher; thread-safe."""

    def __init__(
        self,
        *,
        max_sets: int = DEFAULT_MAX_SETS,
        idle_s: float = DEFAULT_IDLE_S,
        max_rss_bytes: int = DEFAULT_MAX_RSS_BYTES,
        keep_communicators: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``keep_communicators``: a kept set also keeps its communicator for a job of the same membership."""
        if max_sets < 0:
            raise ValueError(f"max_sets must be >= 0, got {max_sets}")
        if idle_s <= 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s}")
        self._max_sets = max_sets
        self._idle_s = idle_s
        self._max_rss_bytes = max_rss_bytes
        self.keep_communicators = keep_communicators
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: OrderedDict[WorkerSetKey, _IdleSet] = OrderedDict()  # least recently used first
        self._closed = False
        self._wake = threading.Event()
        self._reaper: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._max_sets > 0 and not self._closed

    def idle_keys(self) -> list[WorkerSetKey]:
        """The keys of the idle sets, least recently used first."""
        with self._lock:
            return list(self._idle)

    def take(self, key: WorkerSetKey) -> list[WorkerProcess] | None:
        """The idle set of ``key``, now no longer idle (the caller runs a job on it), or None."""
        with self._lock:
            found = self._idle.pop(key, None)
        if found is None:
            return None
        if any(w.process.poll() is not None for w in found.workers):
            # One died while idle (killed from outside, out of memory): the set is no use to any job.
            logger.info("kept worker set %s lost a process while idle; starting fresh workers", key)
            _end_all(found.workers)
            return None
        return found.workers

    def keep(self, key: WorkerSetKey, workers: list[WorkerProcess]) -> bool:
        """Keep ``workers`` idle under ``key`` if they may be kept, else kill them; True when kept."""
        why = self._refusal(workers)
        if why:
            logger.info("worker set %s not kept: %s", key, why)
            _end_all(workers)
            return False
        evicted: list[WorkerProcess] = []
        with self._lock:
            if self._closed:
                evicted = workers
            else:
                old = self._idle.pop(key, None)
                if old is not None:  # two jobs of one key cannot both have run here; kill the older anyway
                    evicted += old.workers
                self._idle[key] = _IdleSet(workers, self._clock())
                while len(self._idle) > self._max_sets:
                    lru, dropped = self._idle.popitem(last=False)
                    logger.info("kept worker set %s evicted: more than %d idle sets", lru, self._max_sets)
                    evicted += dropped.workers
                self._start_reaper()
        _end_all(evicted)
        return evicted is not workers

    def _refusal(self, workers: Sequence[WorkerProcess]) -> str:
        if not self.enabled:
            return "keeping worker sets is off" if not self._closed else "the launcher is stopping"
        for w in workers:
            if w.process.poll() is not None:
                return f"worker {w.pid} exited"
            rss = w.rss_bytes()
            if rss > self._max_rss_bytes:
                return f"worker {w.pid} holds {rss >> 20} MiB, above the bound of {self._max_rss_bytes >> 20} MiB"
        return ""

    def reap(self) -> list[WorkerSetKey]:
        """Kill the sets idle for ``idle_s`` or longer; return their keys."""
        now = self._clock()
        expired: list[tuple[WorkerSetKey, _IdleSet]] = []
        with self._lock:
            for key, idle in list(self._idle.items()):
                if now - idle.since >= self._idle_s:
                    expired.append((key, self._idle.pop(key)))
        for key, idle in expired:
            logger.info("kept worker set %s idle for %.0f s: ended", key, now - idle.since)
            _end_all(idle.workers)
        return [key for key, _ in expired]

    def close(self) -> None:
        """Kill every idle set and keep none from now on (the agent is stopping)."""
        with self._lock:
            self._closed = True
            idle = [w for s in self._idle.values() for w in s.workers]
            self._idle.clear()
        self._wake.set()
        _end_all(idle)

    def _start_reaper(self) -> None:
        # Called with the lock held: one reaper runs while any set is idle, and exits when none is.
        if self._reaper is not None and self._reaper.is_alive():
            return
        self._reaper = threading.Thread(target=self._reap_while_idle, name="kept-workers-reaper", daemon=True)
        self._reaper.start()

    def _reap_while_idle(self) -> None:
        while True:
            with self._lock:
                if self._closed or not self._idle:
                    self._reaper = None
                    return
                oldest = min(s.since for s in self._idle.values())
            self._wake.wait(max(0.05, oldest + self._idle_s - self._clock()))
            self.reap()


def _end_all(workers: Sequence[WorkerProcess]) -> None:
    for w in workers:
        w.kill_group()  # all at once first, then reap each
    for w in workers:
        w.end()
