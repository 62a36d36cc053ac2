"""The benchmark work directory is pruned of old jobs' directories, never of one a job may still use."""

from __future__ import annotations

import os
from pathlib import Path

from topo_tune.agent.bench.job_dirs import KEEP_S, prune_job_dirs

NOW = 1_800_000_000.0


def _job_dir(work: Path, name: str, *, age_s: float, rank_file_age_s: float | None = None) -> Path:
    rank_dir = work / name / "rank-0"
    rank_dir.mkdir(parents=True)
    log = rank_dir / "worker.log"
    log.write_text("rank 0 log\n")
    for path in (log, rank_dir, work / name):
        os.utime(path, (NOW - age_s, NOW - age_s))
    if rank_file_age_s is not None:
        os.utime(log, (NOW - rank_file_age_s, NOW - rank_file_age_s))
    return work / name


def test_only_directories_unchanged_for_longer_than_any_job_runs_are_removed(tmp_path: Path) -> None:
    work = tmp_path / "bench"
    old = _job_dir(work, "gate-old", age_s=3 * 86_400)
    recent = _job_dir(work, "gate-recent", age_s=3600)
    # Another agent on a shared work directory still writes a rank file of an old-looking job: kept.
    shared = _job_dir(work, "job-shared", age_s=3 * 86_400, rank_file_age_s=60)
    (work / "notes.txt").write_text("not a job directory")

    assert prune_job_dirs(work, now=NOW) == ["gate-old"]
    assert not old.exists() and recent.exists() and shared.exists() and (work / "notes.txt").exists()
    assert KEEP_S > 86_400, "longer than the longest deadline a job may have"
    assert prune_job_dirs(tmp_path / "missing", now=NOW) == [], "no work directory yet: nothing to do"
