"""Wave gates: judge a wave on interleaved A/B samples of the new and the previous version.

Argo Rollouts' analysis semantics: ``successful`` lets the rollout continue, ``failed`` rolls it back,
``inconclusive`` pauses it for a human. The measures are the ones a study promotes on:

* communication time: the paired ratio new/previous per A/B repeat. Promotion needs a gain of at least
  ``min_gain`` (default 3 %) shown at ``p < alpha`` (default 0.01); a slowdown beyond ``max_regression``
  (default 3 %) that is itself significant fails the wave. A negative ``min_gain`` makes the check one of
  non-inferiority: the new version passes when shown to be at most ``-min_gain`` slower (for a version
  already proven elsewhere, rolled out on a fabric where it changes nothing measurable);
* p99 latency: a significant increase beyond ``max_p99_regression`` fails the wave;
* throughput stability: a coefficient of variation of the new version's bus bandwidth above ``max_cv``
  (default 0.09) means the measurement cannot be trusted: inconclusive;
* against a reference: the new version's bus bandwidth at the largest size, compared with the first wave
  of the rollout that passed its gate with as many nodes (the canary, usually). A drop beyond ``max_drop``
  (default 20 %) that is significant fails the wave. An A/B on one wave's nodes cannot see a rack whose
  links are slow — both arms are slowed alike — this can; busbw of a wave of another size is no reference,
  so such waves are not compared;
* node health: a node of the wave that is lost makes the gate inconclusive, so the rollout pauses and never
  proceeds past it (a failure still rolls back: that is the safe direction).

The test is an exact sign-flip (paired permutation) test on log ratios, which assumes no distribution
beyond symmetry under the null; above 16 pairs it samples 20,000 sign patterns with a fixed seed, so the
same samples always give the same verdict. Fewer than ``ceil(log2(1/alpha))`` pairs can never reach
``alpha`` and are inconclusive by construction.

Non-goals: running the benchmark (the engine's verifier does) and storing the verdict (``store.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.errors import ValidationError

_EXACT_MAX_PAIRS = 16
_SAMPLED_PATTERNS = 20_000


class Outcome(StrEnum):
    SUCCESSFUL = "successful"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Sample:
    """One measurement of one arm in one A/B repeat."""

    repeat: int
    arm: str
    """``new`` or ``previous``."""
    time_us: float
    p99_us: float
    busbw_gbps: float


ARMS = ("new", "previous")


@dataclass(frozen=True)
class GateVerdict:
    outcome: Outcome
    reasons: tuple[str, ...]
    pairs: int = 0
    time_change: float = 0.0
    """Geometric-mean ratio new/previous - 1: negative is faster."""
    p_gain: float = 1.0
    p_regression: float = 1.0
    p99_change: float = 0.0
    p_p99_regression: float = 1.0
    cv_new: float = 0.0
    lost_nodes: tuple[str, ...] = field(default_factory=tuple)
    busbw_new: float = 0.0
    """Geometric mean of the new version's bus bandwidth (GB/s): a later wave's reference."""
    reference_busbw: float = 0.0
    """The reference this wave was compared with (0: none)."""
    busbw_drop: float = 0.0
    p_drop: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": self.outcome.value, "reasons": list(self.reasons)}


def sign_flip_p(differences: Sequence[float], *, seed: int = 0) -> float:
    """One-sided p-value that the mean of ``differences`` is > 0 (exact up to 16 values)."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n == 0:
        return 1.0
    observed = d.sum()
    if n <= _EXACT_MAX_PAIRS:
        patterns = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1
        totals = patterns @ np.abs(d)
        return float(np.mean(totals >= observed - 1e-12))
    rng = np.random.default_rng(seed)
    signs = rng.choice((-1.0, 1.0), size=(_SAMPLED_PATTERNS, n))
    totals = signs @ np.abs(d)
    return float((np.sum(totals >= observed - 1e-12) + 1) / (_SAMPLED_PATTERNS + 1))


def _pairs(samples: Sequence[Sample]) -> list[tuple[Sample, Sample]]:
    by_repeat: dict[int, dict[str, Sample]] = {}
    for sample in samples:
        if sample.arm not in ARMS:
            raise ValidationError("samples.arm", f"{sample.arm!r} is neither 'new' nor 'previous'")
        if sample.time_us <= 0 or sample.p99_us <= 0:
            raise ValidationError("samples.time_us", f"repeat {sample.repeat}: times must be positive")
        if sample.arm in by_repeat.setdefault(sample.repeat, {}):
            raise ValidationError("samples.repeat", f"repeat {sample.repeat} has two {sample.arm!r} samples")
        by_repeat[sample.repeat][sample.arm] = sample
    return [(arms["new"], arms["previous"]) for _, arms in sorted(by_repeat.items()) if len(arms) == 2]


def check_reachable(gate: RolloutGateConfig, thresholds: RolloutThresholdsConfig) -> None:
    """``ValidationError`` when a gate of ``gate.repeats`` A/B repeats can never reach ``p < alpha``: every
    wave would be inconclusive, so the rollout could never pass its canary."""
    if gate.repeats < thresholds.min_pairs:
        raise ValidationError(
            "gate.repeats",
            f"{gate.repeats} A/B repeats can never show p < {thresholds.alpha}: at least {thresholds.min_pairs} "
            "are needed (the sign-flip test's smallest p with n pairs is 2^-n)",
        )


def judge(
    samples: Sequence[Sample],
    thresholds: RolloutThresholdsConfig,
    *,
    repeats: int = 0,
    lost_nodes: Sequence[str] = (),
    reference_busbw: float = 0.0,
) -> GateVerdict:
    """The gate's verdict on A/B samples, a reference bus bandwidth (0: none) and the wave's node health.

    ``repeats``: how many A/B repeats were asked for (0: not known), so that a verdict short of pairs says
    how many of them gave one."""
    pairs = _pairs(samples)
    lost = tuple(sorted(lost_nodes))
    if len(pairs) < thresholds.min_pairs:
        ran = f" of {repeats} A/B repeats run" if repeats else ""
        reasons = [
            f"{len(pairs)} usable A/B pairs{ran} (a repeat whose benchmark failed gives none); "
            f"at least {thresholds.min_pairs} are needed to reach p < {thresholds.alpha}"
        ]
        if lost:
            reasons.append(f"lost nodes: {', '.join(lost)}")
        return GateVerdict(Outcome.INCONCLUSIVE, tuple(reasons), pairs=len(pairs), lost_nodes=lost)
    f = _figures(pairs, thresholds, reference_busbw)
    failures = _failures(f, thresholds, reference_busbw)
    pending = _pending(f, thresholds, lost)
    if failures:
        outcome, reasons = Outcome.FAILED, failures + pending
    elif pending:
        outcome, reasons = Outcome.INCONCLUSIVE, pending
    else:
        outcome = Outcome.SUCCESSFUL
        reasons = [
            f"communication time {f.time_change:+.1%} (p = {f.p_gain:.4f}), p99 {f.p99_change:+.1%}, CV {f.cv_new:.3f}"
        ]
    return GateVerdict(
        outcome,
        tuple(reasons),
        pairs=len(pairs),
        time_change=f.time_change,
        p_gain=f.p_gain,
        p_regression=f.p_regression,
        p99_change=f.p99_change,
        p_p99_regression=f.p_p99,
        cv_new=f.cv_new,
        lost_nodes=lost,
        busbw_new=f.busbw_new,
        reference_busbw=reference_busbw,
        busbw_drop=f.busbw_drop,
        p_drop=f.p_drop,
    )


@dataclass(frozen=True)
class _Figures:
    """What a gate's pairs show: changes of the new arm against the previous, and each test's p-value."""

    time_change: float
    p99_change: float
    p_gain: float
    p_regression: float
    p_p99: float
    cv_new: float
    busbw_new: float
    busbw_drop: float
    p_drop: float


def _figures(
    pairs: Sequence[tuple[Sample, Sample]], thresholds: RolloutThresholdsConfig, reference_busbw: float
) -> _Figures:
    log_ratio = [math.log(new.time_us / prev.time_us) for new, prev in pairs]
    p99_ratio = [math.log(new.p99_us / prev.p99_us) for new, prev in pairs]
    shift = math.log(1 + thresholds.min_gain)
    busbw = np.asarray([new.busbw_gbps for new, _ in pairs])
    busbw_new = float(np.exp(np.mean(np.log(busbw)))) if bool(np.all(busbw > 0)) else 0.0
    busbw_drop, p_drop = 0.0, 1.0
    if reference_busbw > 0 and busbw_new > 0:
        busbw_drop = 1 - busbw_new / reference_busbw
        floor = math.log(reference_busbw * (1 - thresholds.max_drop))
        p_drop = sign_flip_p([floor - math.log(b) for b in busbw])
    return _Figures(
        time_change=math.exp(float(np.mean(log_ratio))) - 1,
        p99_change=math.exp(float(np.mean(p99_ratio))) - 1,
        p_gain=sign_flip_p([-r - shift for r in log_ratio]),
        p_regression=sign_flip_p(log_ratio),
        p_p99=sign_flip_p(p99_ratio),
        cv_new=float(busbw.std(ddof=1) / busbw.mean()) if busbw.mean() > 0 else math.inf,
        busbw_new=busbw_new,
        busbw_drop=busbw_drop,
        p_drop=p_drop,
    )


def _failures(f: _Figures, thresholds: RolloutThresholdsConfig, reference_busbw: float) -> list[str]:
    """What the pairs show to be worse than allowed: each fails the gate."""
    failures: list[str] = []
    if f.time_change > thresholds.max_regression and f.p_regression < thresholds.alpha:
        failures.append(
            f"communication time {f.time_change:+.1%} (p = {f.p_regression:.4f}), beyond the allowed "
            f"{thresholds.max_regression:.0%} slowdown"
        )
    if f.p99_change > thresholds.max_p99_regression and f.p_p99 < thresholds.alpha:
        failures.append(
            f"p99 latency {f.p99_change:+.1%} (p = {f.p_p99:.4f}), beyond the allowed "
            f"{thresholds.max_p99_regression:.0%}"
        )
    if f.busbw_drop > thresholds.max_drop and f.p_drop < thresholds.alpha:
        failures.append(
            f"bus bandwidth {f.busbw_new:.4g} GB/s, {f.busbw_drop:.0%} below the reference {reference_busbw:.4g} GB/s "
            f"(p = {f.p_drop:.4f}), beyond the allowed {thresholds.max_drop:.0%} drop"
        )
    return failures


def _pending(f: _Figures, thresholds: RolloutThresholdsConfig, lost: tuple[str, ...]) -> list[str]:
    """What keeps the gate from passing without failing it: each makes it inconclusive."""
    pending: list[str] = []
    if lost:
        pending.append(f"lost nodes: {', '.join(lost)}")
    if f.cv_new > thresholds.max_cv:
        pending.append(f"throughput unstable: CV {f.cv_new:.3f} > {thresholds.max_cv}")
    if f.p_gain >= thresholds.alpha:
        wanted = (
            f"gain of {thresholds.min_gain:.0%}"
            if thresholds.min_gain >= 0
            else f"slowdown of at most {-thresholds.min_gain:.0%}"
        )
        pending.append(f"{wanted} not shown: time {f.time_change:+.1%} (p = {f.p_gain:.4f})")
    return pending
