"""What production jobs' timing records show: whether a job's ranks agree on what ran, and whether an arm is
no worse than the chosen table, per (collective, size class), with the proof's statistics.

A job is one sample. Every rank of a communicator times the same calls (the plugin samples by the
communicator's own call count), so a job's value for a (collective, size class) is the mean of ln(ns) over
every timed call of all its records. Jobs are independent and unpaired, so an arm is compared with the chosen
table by the difference of the two arms' mean job values (the log speedup of the arm), with Welch's
one-sided t bounds at ``alpha`` (``statistics.compare_unpaired``), and decided in the proof's words
(``statistics.decide``: safe when the lower bound is at least ``1 - maxLoss``, gains beyond ``minEffect``
Holm-corrected over every compared cell).
Size classes, not buckets, are compared: jobs call different sizes within a bucket, and a bucket's mean
would compare size mixes rather than tables. Jobs with a divergent record are for the caller to set aside
(``divergence``) before they are compared; ranks that ran different choices (``disagreement``) are also the
controller's cue to stop the version's learning.

Non-goals: reading the files (``plugin.timing_record``), proposing versions, and pooling across NCCL
versions or cluster shapes (the caller groups records by what they ran on).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from topo_tune.errors import ConfigError
from topo_tune.learning.assignment import CHOSEN_ARM, ArmIndex
from topo_tune.plugin.timing_record import TimingRecord
from topo_tune.tuner import statistics

__all__ = ["ArmComparison", "CellKey", "JobTiming", "compare_arms", "disagreement", "divergence", "job_timing"]

CellKey = tuple[str, int]
"""(collective, size class's largest bytes)."""
_Ran = Counter[tuple[str, int, str]]
"""A rank's calls per (collective, size class, choice)."""


@dataclass(frozen=True, slots=True)
class JobTiming:
    """One job's value per (collective, size class): the mean ln(ns) of its timed calls, and how many."""

    arm: ArmIndex
    log_means: Mapping[CellKey, float]
    timed: Mapping[CellKey, int]


@dataclass(frozen=True, slots=True)
class ArmComparison:
    """One arm against the chosen table in one (collective, size class)."""

    collective: str
    class_bytes: int
    comparison: statistics.Comparison
    """``speedup`` > 1: the arm is faster; ``pairs`` is the smaller arm's number of jobs."""
    decision: statistics.Decision


def _what_ran(records: Iterable[TimingRecord]) -> tuple[dict[int, dict[int, _Ran]], dict[int, int]]:
    """Per communicator: each rank's calls per (collective, size class, choice), and its number of ranks."""
    ranks: dict[int, dict[int, _Ran]] = defaultdict(dict)
    sizes: dict[int, int] = {}
    for r in records:
        ranks[r.comm][r.rank] = Counter({(c.collective, c.class_bytes, c.choice): c.calls for c in r.cells})
        sizes[r.comm] = r.n_ranks
    return ranks, sizes


def disagreement(records: Iterable[TimingRecord]) -> list[str]:
    """One line per communicator two of whose ranks' records of what ran disagree (ranks whose record is
    missing are not counted: their records may still be on their way).

    Every rank of a communicator makes the same calls, and NCCL launches each with one algorithm and protocol
    on all of them; different counts mean some call was chosen differently somewhere: the hang the design
    rules out (``docs/learning.md``) came near.
    """
    ranks, _ = _what_ran(records)
    findings = []
    for comm, by_rank in sorted(ranks.items()):
        first_rank, first = min(by_rank.items())
        for rank, counts in sorted(by_rank.items()):
            if counts != first:
                key = min(set(counts) ^ set(first) or {k for k in counts if counts[k] != first[k]})
                name = f"{key[0]} {key[1]} {key[2]}"
                findings.append(
                    f"comm {comm:x}: rank {rank} ran {name} {counts[key]} times, rank {first_rank} {first[key]}"
                )
                break
    return findings


def divergence(records: Iterable[TimingRecord]) -> list[str]:
    """The ``disagreement`` lines, then one per communicator that lacks some rank's record: a job with any of
    them is not compared."""
    records = list(records)
    ranks, sizes = _what_ran(records)
    missing = [
        f"comm {comm:x}: records from {len(by_rank)} of its {sizes[comm]} ranks"
        for comm, by_rank in sorted(ranks.items())
        if len(by_rank) != sizes[comm]
    ]
    return disagreement(records) + missing


def job_timing(records: Sequence[TimingRecord]) -> JobTiming:
    """The job's value per (collective, size class) from all its records (every rank, every communicator).

    Raises:
        ConfigError: no record, a record without an arm, or records naming different arms.
    """
    arms = {r.arm for r in records}
    if len(arms) != 1 or None in arms:
        raise ConfigError("arm", f"a job's records must all name one arm, got {sorted(map(str, arms)) or 'none'}")
    sums: dict[CellKey, float] = defaultdict(float)
    timed: dict[CellKey, int] = defaultdict(int)
    for r in records:
        for c in r.cells:
            if c.timed:
                sums[(c.collective, c.class_bytes)] += c.sum_log
                timed[(c.collective, c.class_bytes)] += c.timed
    (arm,) = arms
    return JobTiming(ArmIndex(arm or 0), {k: sums[k] / timed[k] for k in sums}, dict(timed))


def compare_arms(
    jobs: Sequence[JobTiming],
    *,
    arm: ArmIndex,
    alpha: float = statistics.DEFAULT_ALPHA,
    min_effect: float = statistics.DEFAULT_MIN_EFFECT,
    max_loss: float = statistics.DEFAULT_MAX_LOSS,
) -> list[ArmComparison]:
    """``arm`` against the chosen table in every (collective, size class) at least 2 jobs of each timed.

    Raises:
        ConfigError: ``arm`` is the chosen table itself, or a bad alpha, minEffect or maxLoss.
    """
    if arm == CHOSEN_ARM:
        raise ConfigError("arm", "compare a challenger with the chosen table, not the chosen table with itself")
    values: dict[tuple[CellKey, bool], list[float]] = defaultdict(list)
    for job in jobs:
        if job.arm in (arm, CHOSEN_ARM):
            for key, mean in job.log_means.items():
                values[(key, job.arm == arm)].append(mean)
    keys = sorted(
        # .get: indexing the defaultdict while iterating it would add keys (a cell only the chosen arm timed).
        k
        for (k, is_arm) in values
        if not is_arm and len(values.get((k, True), [])) >= 2 and len(values[(k, False)]) >= 2
    )
    # A job's value is a mean log time: as a time, its geometric mean, which compare_unpaired logs again.
    comparisons = [
        statistics.compare_unpaired(
            [math.exp(v) for v in values[(k, False)]],
            [math.exp(v) for v in values[(k, True)]],
            alpha=alpha,
            min_effect=min_effect,
        )
        for k in keys
    ]
    decisions = statistics.decide(comparisons, alpha=alpha, max_loss=max_loss)
    return [ArmComparison(k[0], k[1], c, d) for k, c, d in zip(keys, comparisons, decisions, strict=True)]
