"""What a Slurm ``TaskProlog`` prints for a task, and the node-local cache that makes it one round trip per job.

slurmstepd reads the TaskProlog's stdout line by line: ``export NAME=value`` sets ``NAME`` in the task's
environment to *everything* after ``=`` (no shell unquoting: quotes would end up in the value), so a value is
printed only when it needs no quoting at all, and only for the names in :data:`PROLOG_NAMES`. Every task of a
job runs the prolog; the first on a node asks the controller and writes the answer (or the reason there is
none) into :class:`PrologCache`, the others read it under the same lock, so all tasks on a node agree.

Non-goals: resolving the job (``topo_tune.cli.job`` does, as for ``env``) and talking to Slurm.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from topo_tune.plugin.job_env import LEARNING_ARM_ENV, PLUGIN_ENV, PROFILER_ENV, TABLE_ENV, TIMING_SAMPLE_ENV

PROLOG_NAMES = frozenset(
    {
        "NCCL_CONF_FILE",
        "NCCL_TOPO_FILE",
        PLUGIN_ENV,
        TABLE_ENV,
        # A job pinned with a learning arm (by an exec that asked first) runs that arm's table on every rank.
        PROFILER_ENV,
        TIMING_SAMPLE_ENV,
        LEARNING_ARM_ENV,
        "TOPO_TUNE_CONFIG_VERSION",
        "TOPO_TUNE_JOB_ID",
        "TOPO_TUNE_NODE_RANK",
        "TOPO_TUNE_NNODES",
        "TOPO_TUNE_MASTER_ADDR",
        "TOPO_TUNE_NODE_ORDER",
    }
)
"""The only variables a task prolog exports: a controller cannot set LD_PRELOAD or PATH in a user's job."""

_SAFE_VALUE = re.compile(r"[A-Za-z0-9_@%+=:,./-]*")
"""Characters a value may hold: what ``shlex.quote`` leaves unquoted, so the line reads the same to a shell."""


def prolog_lines(variables: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines for ``variables``, all or none.

    Raises:
        ValueError: a name outside :data:`PROLOG_NAMES`, or a value that would need quoting; the message names it.
    """
    lines = []
    for name, value in variables.items():
        if name not in PROLOG_NAMES:
            raise ValueError(f"{name} is not a variable a task prolog may set")
        if not _SAFE_VALUE.fullmatch(value):
            raise ValueError(f"{name}: {value[:80]!r} holds characters Slurm would pass on unquoted")
        lines.append(f"export {name}={value}")
    return lines


@dataclass(frozen=True)
class PrologAnswer:
    """One job's answer on one node: its lines, or why there are none (then the job runs on NCCL's defaults)."""

    lines: tuple[str, ...] = ()
    reason: str = ""


CACHE_MAX_AGE_S = 24 * 3600.0
"""Answers older than this are removed when a new one is written. Only a shortcut: a longer job's next task
asks again and the controller answers from the job's pin, the same config and order."""


class PrologCache:
    """``directory/<key>.json`` per (job id, node, node list), written once under ``<key>.lock``.

    The directory must be the caller's own and closed to others (mode 0700): another user's file there could
    otherwise hand this user's job a different config. A directory that is not is refused, not used.
    """

    def __init__(self, directory: Path, *, max_age_s: float = CACHE_MAX_AGE_S) -> None:
        self.directory = directory
        self.max_age_s = max_age_s

    def check(self) -> None:
        """Create the directory (0700) or refuse one this user does not own or others may write.

        Raises:
            OSError: it cannot be created, or it is not private; the message names the path.
        """
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = self.directory.lstat()
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
            raise OSError(f"{self.directory} is not a directory of uid {os.getuid()} closed to others (mode 0700)")

    @staticmethod
    def key(job_id: str, node: str, nodes: Sequence[str]) -> str:
        text = json.dumps([job_id, node, sorted(nodes)])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @contextmanager
    def locked(self, key: str) -> Iterator[Path]:
        """Hold ``key``'s lock (the node's other tasks wait) and yield its answer's path."""
        with (self.directory / f"{key}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self.directory / f"{key}.json"

    @staticmethod
    def read(path: Path) -> PrologAnswer | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not all(isinstance(line, str) for line in data.get("lines", [])):
            return None
        return PrologAnswer(tuple(data.get("lines", [])), str(data.get("reason", "")))

    def write(self, path: Path, answer: PrologAnswer) -> None:
        """Store ``answer`` at ``path`` (whole or not at all), and remove answers older than ``max_age_s``."""
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps({"lines": list(answer.lines), "reason": answer.reason}), encoding="utf-8")
        partial.replace(path)
        oldest = time.time() - self.max_age_s
        for old in self.directory.glob("*.json"):
            with contextlib.suppress(OSError):  # another task removed it first
                if old != path and old.stat().st_mtime < oldest:
                    old.unlink()
                    old.with_suffix(".lock").unlink(missing_ok=True)
