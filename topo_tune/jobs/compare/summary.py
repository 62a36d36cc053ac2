"""The figures of a job's A/B: median per arm, the paired gain with its bounds, and the proof's decision.

The statistics are the tuner's proof statistics (``tuner.statistics``), not a copy: each pair gives one log
ratio, and ``compare`` puts one-sided t bounds at ``alpha`` each on the geometric-mean gain, so
``[ci_low, ci_high]`` is a two-sided ``1 - 2·alpha`` interval (98 % at the default alpha of 0.01);
``decide`` says what was shown exactly as a proof bucket's decision does (``faster`` only when the gain
beyond the proof's minimum effect is significant; ``not shown safe`` when a loss beyond its margin cannot be
ruled out). The gain is oriented so that above 1 always means the ``--compare`` arm is better: the
``--against`` value over the candidate's for a lower-is-better metric (a step time), the reverse for a
higher-is-better one (a throughput).

Non-goals: scheduling the runs (``schedule``), reading values (``metric``), storing (the controller).
"""

from __future__ import annotations

import statistics as stdlib_statistics
from collections.abc import Sequence
from dataclasses import dataclass

from topo_tune.errors import ConfigError, ValidationError
from topo_tune.jobs.compare.schedule import Arm
from topo_tune.tuner import statistics


@dataclass(frozen=True)
class RunValue:
    """One run's metric value, with its place in the schedule."""

    index: int
    pair: int
    arm: Arm
    value: float
    node: str = ""
    """Where the value was read: the node that was node rank 0 of the run."""


@dataclass(frozen=True)
class ComparisonSummary:
    pairs: int
    candidate_median: float
    against_median: float
    gain: float
    """Geometric mean over the pairs of the candidate's advantage; > 1: the ``--compare`` arm is better."""
    ci_low: float
    ci_high: float
    confidence: float
    """The two-sided level of ``[ci_low, ci_high]``: ``1 - 2 * alpha``."""
    p_value: float
    """One-sided, H0: gain <= 1."""
    decision: statistics.Decision
    higher_is_better: bool


def _paired(runs: Sequence[RunValue]) -> list[tuple[float, float]]:
    """(candidate, against) per pair, in pair order; ``ValidationError`` unless each pair has one of each."""
    by_pair: dict[int, dict[Arm, float]] = {}
    for run in runs:
        arms = by_pair.setdefault(run.pair, {})
        if run.arm in arms:
            raise ValidationError("runs", f"pair {run.pair} has two {run.arm.value} runs")
        arms[run.arm] = run.value
    for pair in range(len(by_pair)):
        if len(by_pair.get(pair, {})) != 2:
            raise ValidationError("runs", f"pair {pair} is not complete (each pair runs both arms once)")
    return [(by_pair[p][Arm.CANDIDATE], by_pair[p][Arm.AGAINST]) for p in range(len(by_pair))]


def summarise(
    runs: Sequence[RunValue],
    *,
    higher_is_better: bool,
    alpha: float = statistics.DEFAULT_ALPHA,
    min_effect: float = statistics.DEFAULT_MIN_EFFECT,
    max_loss: float = statistics.DEFAULT_MAX_LOSS,
) -> ComparisonSummary:
    """The comparison's figures from every run of both arms (at least two complete pairs)."""
    pairs = _paired(runs)
    candidate = [c for c, _ in pairs]
    against = [a for _, a in pairs]
    # compare() reads lower-is-better times as (baseline, candidate): its speedup is baseline / candidate.
    worse_first, better_first = (candidate, against) if higher_is_better else (against, candidate)
    try:
        shown = statistics.compare(worse_first, better_first, alpha=alpha, min_effect=min_effect)
    except ConfigError as error:  # fewer than two pairs, a value <= 0: the runs' fault
        raise ValidationError("runs", error.reason) from None
    (decision,) = statistics.decide([shown], alpha=alpha, max_loss=max_loss)
    return ComparisonSummary(
        pairs=len(pairs),
        candidate_median=stdlib_statistics.median(candidate),
        against_median=stdlib_statistics.median(against),
        gain=shown.speedup,
        ci_low=shown.ci_low,
        ci_high=shown.ci_high,
        confidence=1 - 2 * alpha,
        p_value=shown.p_value,
        decision=decision,
        higher_is_better=higher_is_better,
    )
