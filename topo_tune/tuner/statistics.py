"""The statistics of the proof: is a finalist safe, and faster, per (collective, size bucket)?

Purpose: the finalists are re-measured interleaved with the baseline (A B A B …), so slow drift of the
machine hits both sides alike; each pair gives one log time ratio ``d = ln(t_baseline / t_candidate)``. On
those paired differences (a t model, ``n - 1`` degrees of freedom) each bucket gets one-sided confidence
bounds of its speedup ``exp(mean d)`` and one of four decisions, each saying exactly what was shown:

* ``faster`` — shown safe, and the gain beyond ``min_effect`` is significant after Holm's correction over
  every bucket of the proof (a false "faster" anywhere is a family-wise error, so gains are corrected);
* ``no difference shown`` — shown safe: the lower bound is at least ``1 - max_loss``; no gain shown;
* ``slower`` — shown to lose more than ``max_loss``: the upper bound is below ``1 - max_loss``;
* ``not shown safe`` — neither: the data cannot rule out a loss beyond ``max_loss``.

Safety is an **intersection-union test** (Berger 1982, Technometrics 24:295): a configuration is shown
safe only if *every* weighted bucket is shown non-inferior, so the null "some bucket loses more than
``max_loss``" is a union and is rejected only when each of its parts is rejected at level ``alpha``. The
family's error is then at most ``alpha`` with no multiplicity correction; correcting (Holm, Bonferroni) would
only make each bucket's bound wider and shipping *harder*, never safer, so it is not done on this side.
That error is per configuration: choosing among ``k`` finalists, each tested so, ships one that loses more
than ``max_loss`` somewhere with probability at most ``k * alpha`` (a union bound over the truly unsafe
finalists; one finalist gives ``alpha``). Splitting ``alpha`` among the finalists would bound the choice by
``alpha`` at the cost of wider bounds (measured in ``benchmarks/results/safe-promotion.md``); it is not done.

The proof may look at the data more than once (:class:`SequentialDesign`): up to ``max_pairs`` in looks of
``first`` pairs. Each look spends part of ``alpha`` along a pre-set alpha-spending function (Lan & DeMets
1983, Biometrika 70:659); the bound of a look uses that look's share, and by the Bonferroni inequality over
the looks the running bounds (the best lower and upper bound seen so far) hold together with probability at
least ``1 - alpha`` whenever the proof stops. This is conservative next to exact group-sequential boundaries
(which need the looks' joint distribution) but valid for any stopping rule, which naive repeated peeking at
a fixed-n test is not.

Non-goals: choosing finalists and scheduling the re-measurements (``proof``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from topo_tune.config.cluster import PROOF_ALPHA, PROOF_MAX_LOSS, PROOF_MIN_EFFECT
from topo_tune.errors import ConfigError

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MAX_LOSS",
    "DEFAULT_MIN_EFFECT",
    "Bounds",
    "Comparison",
    "Decision",
    "SequentialDesign",
    "compare",
    "compare_unpaired",
    "decide",
    "holm",
]

DEFAULT_ALPHA = PROOF_ALPHA
DEFAULT_MIN_EFFECT = PROOF_MIN_EFFECT
DEFAULT_MAX_LOSS = PROOF_MAX_LOSS


class Decision(enum.Enum):
    FASTER = "faster"
    NO_DIFFERENCE = "no difference shown"
    NOT_SHOWN_SAFE = "not shown safe"
    SLOWER = "slower"

    @property
    def safe(self) -> bool:
        """Shown non-inferior (speedup >= 1 - max_loss at the proof's level)."""
        return self in (Decision.FASTER, Decision.NO_DIFFERENCE)

    @property
    def decided(self) -> bool:
        """Nothing more to measure for this bucket's safety."""
        return self is not Decision.NOT_SHOWN_SAFE


@dataclass(frozen=True)
class Comparison:
    """Paired baseline/candidate times of one (collective, bucket) at one look, and their one-sided bounds."""

    speedup: float
    ci_low: float  # one-sided lower bound of the speedup at level ``alpha``
    ci_high: float  # one-sided upper bound at level ``alpha``
    alpha: float  # the one-sided error of each bound
    p_value: float  # H0: speedup <= 1 (no gain)
    p_margin: float  # H0: speedup <= 1 + min_effect
    cv_baseline: float
    cv_candidate: float
    pairs: int

    @property
    def confidence(self) -> float:
        """Each bound's one-sided confidence level."""
        return 1.0 - self.alpha


def compare(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
) -> Comparison:
    """Compare paired times (``baseline[i]`` measured right before ``candidate[i]``; lower is better)."""
    if len(baseline) != len(candidate):
        raise ConfigError("candidate", f"needs one time per baseline time ({len(baseline)}), got {len(candidate)}")
    if len(baseline) < 2:
        raise ConfigError("baseline", f"needs at least 2 pairs, got {len(baseline)}")
    for side, values in (("baseline", baseline), ("candidate", candidate)):
        bad = [v for v in values if not (v > 0 and math.isfinite(v))]
        if bad:
            raise ConfigError(side, f"times must be finite and > 0, got {bad[0]!r}")
    _check_fraction("min_effect", min_effect)
    _check_alpha(alpha)
    n = len(baseline)
    diffs = [math.log(b / c) for b, c in zip(baseline, candidate, strict=True)]
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    return _comparison(mean, se, df=n - 1, baseline=baseline, candidate=candidate, alpha=alpha, min_effect=min_effect)


def _comparison(
    mean: float,
    se: float,
    *,
    df: float,
    baseline: Sequence[float],
    candidate: Sequence[float],
    alpha: float,
    min_effect: float,
) -> Comparison:
    """The bounds and p-values of a mean log speedup with its standard error on ``df`` degrees of freedom."""
    gain_margin = math.log1p(min_effect)
    if se == 0.0:
        # Identical ratios in every pair (a deterministic backend): the sign of each difference is certain.
        p_value = 0.0 if mean > 0 else 1.0
        p_margin = 0.0 if mean > gain_margin else 1.0
        half = 0.0
    else:
        from scipy import stats  # noqa: PLC0415 - SciPy's stats take a second to load; the controller loads this module on every start

        p_value = float(stats.t.sf(mean / se, df))
        p_margin = float(stats.t.sf((mean - gain_margin) / se, df))
        half = float(stats.t.isf(alpha, df)) * se
    return Comparison(
        speedup=math.exp(mean),
        ci_low=math.exp(mean - half),
        ci_high=math.exp(mean + half),
        alpha=alpha,
        p_value=p_value,
        p_margin=p_margin,
        cv_baseline=_cv(baseline),
        cv_candidate=_cv(candidate),
        pairs=min(len(baseline), len(candidate)),
    )


def compare_unpaired(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
) -> Comparison:
    """Compare independent samples of times (lower is better), e.g. one per production job of each arm.

    Welch's t on the log times (unequal variances, Welch-Satterthwaite degrees of freedom); ``pairs`` is the
    smaller sample's size. For measurements taken in pairs, :func:`compare` is the sharper test.
    """
    for side, values in (("baseline", baseline), ("candidate", candidate)):
        if len(values) < 2:
            raise ConfigError(side, f"needs at least 2 samples, got {len(values)}")
        bad = [v for v in values if not (v > 0 and math.isfinite(v))]
        if bad:
            raise ConfigError(side, f"times must be finite and > 0, got {bad[0]!r}")
    _check_fraction("min_effect", min_effect)
    _check_alpha(alpha)
    logs = [[math.log(v) for v in values] for values in (baseline, candidate)]
    means = [sum(x) / len(x) for x in logs]
    shares = [sum((v - m) ** 2 for v in x) / (len(x) - 1) / len(x) for x, m in zip(logs, means, strict=True)]
    mean, se = means[0] - means[1], math.sqrt(sum(shares))
    df = sum(shares) ** 2 / sum(v**2 / (len(x) - 1) for v, x in zip(shares, logs, strict=True)) if se else 1.0
    return _comparison(mean, se, df=df, baseline=baseline, candidate=candidate, alpha=alpha, min_effect=min_effect)


@dataclass(frozen=True)
class Bounds:
    """What the looks so far have shown about one bucket: the running bounds, the point, and the decision.

    ``point`` is the speedup estimated from the same pairs as the bounds (the first ``decided_at``), and it
    lies within ``[low, high]`` by construction: each look's own interval holds its mean, but the running
    bounds are the intersection of several looks' intervals, which may leave the last look's mean outside
    (a point printed outside its own interval); then the point is the nearest end of that intersection, the
    estimate restricted to what every look allowed.
    """

    low: float  # the largest lower bound over the looks (each at its look's share of alpha)
    high: float  # the smallest upper bound
    faster: bool  # the gain beyond min_effect was shown at some look (Holm-corrected)
    decided_at: int  # pairs at the look that decided the bucket's safety (the last look's if undecided)
    estimate: float | None = None  # the speedup over the first ``decided_at`` pairs (None: no look reached)

    @property
    def point(self) -> float:
        """The point estimate, within ``[low, high]``."""
        if self.estimate is not None:
            value = self.estimate
        elif self.low > 0 and math.isfinite(self.high):
            value = math.sqrt(self.low * self.high)  # no look's mean: the middle of the bounds (log scale)
        else:
            value = 1.0
        return min(max(value, self.low), self.high)

    def decision(self, max_loss: float) -> Decision:
        floor = 1.0 - max_loss
        if self.low >= floor:
            return Decision.FASTER if self.faster else Decision.NO_DIFFERENCE
        if self.high < floor:
            return Decision.SLOWER
        return Decision.NOT_SHOWN_SAFE


@dataclass(frozen=True)
class SequentialDesign:
    """Looks after ``first``, ``2 * first``, … pairs up to ``max_pairs``, with ``alpha`` spent over them.

    The spending function gives half of ``alpha`` to the first look (so a clear answer at ``first`` pairs
    costs little power next to a single fixed-size test) and the other half in equal parts to the later looks;
    with one look, all of it.
    """

    first: int
    max_pairs: int
    alpha: float = DEFAULT_ALPHA

    def __post_init__(self) -> None:
        if self.first < 2:
            raise ConfigError("search.proofPairs", f"must be at least 2, got {self.first}")
        if self.max_pairs < self.first:
            raise ConfigError(
                "search.proofPairsMax", f"must be at least proofPairs ({self.first}), got {self.max_pairs}"
            )
        _check_alpha(self.alpha)

    @property
    def looks(self) -> tuple[int, ...]:
        """The pair counts at which the data are looked at."""
        sizes = list(range(self.first, self.max_pairs + 1, self.first))
        if sizes[-1] != self.max_pairs:
            sizes.append(self.max_pairs)
        return tuple(sizes)

    @property
    def alphas(self) -> tuple[float, ...]:
        """The share of ``alpha`` each look spends; they sum to ``alpha``."""
        k = len(self.looks)
        if k == 1:
            return (self.alpha,)
        rest = self.alpha / 2 / (k - 1)
        return (self.alpha / 2, *([rest] * (k - 1)))

    def next_look(self, pairs: int) -> int | None:
        """The pair count of the first look after ``pairs``; None after the last."""
        return next((n for n in self.looks if n > pairs), None)

    def bounds(
        self,
        series: Sequence[Sequence[tuple[float, float]]],
        *,
        min_effect: float = DEFAULT_MIN_EFFECT,
        max_loss: float = DEFAULT_MAX_LOSS,
    ) -> list[Bounds]:
        """Running bounds of every bucket of the proof over the looks its pairs reached.

        ``series[i]`` is bucket i's (baseline, candidate) time pairs in measurement order. A bucket whose
        safety was decided at a look keeps that decision (its bounds stop moving); gains are tested at each
        look over every bucket of the proof with Holm's correction at the look's share of alpha, a bucket not
        measured to that look counting with p = 1.
        """
        _check_fraction("max_loss", max_loss)
        floor = 1.0 - max_loss
        m = len(series)
        low = [0.0] * m
        high = [math.inf] * m
        faster = [False] * m
        decided_at = [0] * m
        point: list[float | None] = [None] * m
        done = [False] * m
        for n, share in zip(self.looks, self.alphas, strict=True):
            p_margin = [1.0] * m
            for i, pairs in enumerate(series):
                if len(pairs) < n:
                    continue
                c = compare([a for a, _ in pairs[:n]], [b for _, b in pairs[:n]], alpha=share, min_effect=min_effect)
                p_margin[i] = c.p_margin
                if done[i]:
                    continue
                low[i] = max(low[i], c.ci_low)
                high[i] = min(high[i], c.ci_high)
                decided_at[i] = n
                point[i] = c.speedup
                done[i] = low[i] >= floor or high[i] < floor
            for i, shown in enumerate(holm(p_margin, share)):
                faster[i] = faster[i] or shown
        return [Bounds(low[i], high[i], faster[i], decided_at[i], point[i]) for i in range(m)]


def decide(
    comparisons: Sequence[Comparison],
    *,
    alpha: float = DEFAULT_ALPHA,
    max_loss: float = DEFAULT_MAX_LOSS,
) -> list[Decision]:
    """One fixed-size look: each comparison's decision, gains Holm-corrected over all of them.

    The comparisons' bounds must be at level ``alpha`` (as :func:`compare` made them).
    """
    _check_alpha(alpha)
    _check_fraction("max_loss", max_loss)
    for c in comparisons:
        if not math.isclose(c.alpha, alpha):
            raise ConfigError("alpha", f"the comparisons' bounds are at {c.alpha}, not {alpha}")
    gains = holm([c.p_margin for c in comparisons], alpha)
    return [
        Bounds(c.ci_low, c.ci_high, g, c.pairs, c.speedup).decision(max_loss)
        for c, g in zip(comparisons, gains, strict=True)
    ]


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm–Bonferroni: which hypotheses are rejected, keeping the family-wise error at ``alpha``."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, index in enumerate(order):
        if p_values[index] <= alpha / (m - rank):
            rejected[index] = True
        else:
            break
    return rejected


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 0.5:
        raise ConfigError("alpha", f"must be within (0, 0.5), got {alpha}")


def _check_fraction(name: str, value: float) -> None:
    if not 0 <= value < 1:
        raise ConfigError(name, f"must be within [0, 1), got {value}")


def _cv(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean
