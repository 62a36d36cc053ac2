"""A version's evidence from its learning jobs, and whether a challenger may be proposed as a new version.

The records of each job (every rank, every communicator) are first compared with each other
(``evidence.divergence``): a job whose ranks disagree on what ran is set aside and counted, never pooled.
The rest are reduced to one value per (collective, size class) per job (``evidence.job_timing``) and each
challenger is compared with the chosen table per cell (``evidence.compare_arms``, the proof's statistics).

A cell **applies** to a challenger when its table changes the chosen table's rows within the class's sizes
(``candidates.changed_buckets`` on the class's range); elsewhere the two arms run the same choices and the
cell measures only noise. A challenger is **proposable** when it is shown faster in at least one cell where it
applies and shown non-inferior (safe) in every cell where it applies: better where it applies, never worse.

Non-goals: storing records or versions (the controller), rolling out what is proposed (the normal rollout
and its gates decide).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topo_tune.ids import BucketName
from topo_tune.learning.assignment import ArmIndex
from topo_tune.learning.candidates import changed_buckets
from topo_tune.learning.evidence import compare_arms, divergence, job_timing
from topo_tune.plugin.timing_record import TimingRecord
from topo_tune.tuner import statistics
from topo_tune.tuner.objective import SizeBucket

__all__ = ["EvidenceCell", "VersionEvidence", "version_evidence"]


@dataclass(frozen=True, slots=True)
class EvidenceCell:
    """One challenger against the chosen table in one (collective, size class)."""

    arm: int
    collective: str
    class_bytes: int
    speedup: float
    """> 1: the challenger is faster; bounds one-sided at the proof's alpha."""
    ci_low: float
    ci_high: float
    jobs: int
    """The smaller arm's number of jobs that timed this cell."""
    decision: str
    """The proof's words (``statistics.Decision``)."""
    applies: bool
    """The challenger's table changes the chosen one's choices within this class."""


@dataclass(frozen=True, slots=True)
class VersionEvidence:
    version: str
    jobs_by_arm: Mapping[int, int]
    """Jobs whose records were compared, per arm (0: the chosen table)."""
    divergent: Sequence[str]
    """One line per job set aside because its ranks' records disagree or one is missing (``job: finding``)."""
    cells: Sequence[EvidenceCell]
    proposable: Sequence[int]
    """Challengers shown better where they apply and never worse there."""
    learning_stopped: bool = False
    """The version's kill switch is set: its new jobs run the chosen table."""
    learning_stopped_why: str = ""
    """Who set it, or the job whose ranks ran different choices (``docs/learning.md``)."""


_SAFE = {d.value for d in statistics.Decision if d.safe}


def _applies(chosen_table: str, challenger_table: str, collective: str, class_bytes: int) -> bool:
    size_class = SizeBucket(BucketName(f"{class_bytes}"), class_bytes // 2 + 1, class_bytes, latency_bound=False)
    changed, _ = changed_buckets(chosen_table, challenger_table, buckets=[size_class])
    return any(c == collective for c, _ in changed)


def version_evidence(
    version: str,
    records_by_job: Mapping[str, Sequence[TimingRecord]],
    *,
    tables: Sequence[str],
    alpha: float = statistics.DEFAULT_ALPHA,
    min_effect: float = statistics.DEFAULT_MIN_EFFECT,
    max_loss: float = statistics.DEFAULT_MAX_LOSS,
) -> VersionEvidence:
    """The evidence of ``version``'s jobs; ``tables[0]`` is its chosen table, ``tables[i]`` challenger i's.

    Raises:
        ConfigError: a job's records name different arms (``evidence.job_timing``).
        TunerTableError: a table is malformed.
    """
    divergent, jobs = [], []
    for job_id, records in sorted(records_by_job.items()):
        findings = divergence(records)
        if findings:
            divergent.append(f"{job_id}: {findings[0]}")
        else:
            jobs.append(job_timing(records))
    counts: dict[int, int] = {}
    for job in jobs:
        counts[job.arm] = counts.get(job.arm, 0) + 1
    cells = []
    for arm in range(1, len(tables)):
        compared = compare_arms(jobs, arm=ArmIndex(arm), alpha=alpha, min_effect=min_effect, max_loss=max_loss)
        cells += [
            EvidenceCell(
                arm,
                c.collective,
                c.class_bytes,
                c.comparison.speedup,
                c.comparison.ci_low,
                c.comparison.ci_high,
                c.comparison.pairs,
                c.decision.value,
                _applies(tables[0], tables[arm], c.collective, c.class_bytes),
            )
            for c in compared
        ]
    proposable = []
    for arm in range(1, len(tables)):
        applying = [c for c in cells if c.arm == arm and c.applies]
        if any(c.decision == statistics.Decision.FASTER.value for c in applying) and all(
            c.decision in _SAFE for c in applying
        ):
            proposable.append(arm)
    return VersionEvidence(version, dict(sorted(counts.items())), divergent, cells, proposable)
