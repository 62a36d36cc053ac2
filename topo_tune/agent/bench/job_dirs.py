"""Pruning the benchmark work directory: each job leaves ``<work dir>/<job id>/`` behind (rank logs, results).

They are kept for a while because a failed job's rank logs are what an operator reads next; without pruning a
long-lived agent (gates, drift checks and studies run jobs every day) fills its state volume. A job directory is
removed once nothing in it changed for ``keep_s`` (default twice the longest deadline a job may have, so a
directory still in use is never taken, also on a work directory several agents share).

Non-goals: the agent's command journal (``journal.py``), staged config versions (``config_store.py``).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from topo_tune.benchmark.job_spec import MAX_DEADLINE_S

__all__ = ["KEEP_S", "prune_job_dirs"]

logger = logging.getLogger(__name__)

KEEP_S = 2.0 * MAX_DEADLINE_S


def _last_change(path: Path) -> float:
    """The newest modification time in ``path``'s tree (a rank directory written after the job directory)."""
    newest = path.stat().st_mtime
    for child in path.rglob("*"):
        newest = max(newest, child.lstat().st_mtime)
    return newest


def prune_job_dirs(work_dir: Path, *, now: float, keep_s: float = KEEP_S) -> list[str]:
    """Remove the job directories under ``work_dir`` unchanged for ``keep_s``; return their names.

    Never raises: a directory that vanished meanwhile (another agent pruned it) or cannot be removed is skipped.
    """
    removed: list[str] = []
    try:
        candidates = [p for p in work_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    for path in sorted(candidates):
        try:
            if now - _last_change(path) <= keep_s:
                continue
            shutil.rmtree(path)
        except OSError as error:
            logger.debug("job directory %s left in place: %s", path, error)
            continue
        removed.append(path.name)
    if removed:
        logger.info("removed %d benchmark job directories older than %.0f h", len(removed), keep_s / 3600)
    return removed
