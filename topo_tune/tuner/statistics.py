"""The proof: does a finalist beat NCCL's defaults beyond noise, per (collective, size bucket)?

Purpose: the finalists are re-measured interleaved with the baseline (A B A B …), so slow drift of the
machine hits both sides alike; each pair gives one log time ratio ``d = ln(t_baseline / t_candidate)``. On
those paired differences, a one-sided t-test decides:

* **promote** when the gain is significantly larger than the minimum effect: the p-value of
  H0 "speedup ≤ 1 + min_effect" is below ``alpha`` (after Holm's correction over every comparison of the
  proof). This implies the plain p-value (H0 "speedup ≤ 1") is below ``alpha`` and the observed gain is at
  least the minimum effect, and it keeps the false-win rate with equal distributions far below ``alpha``;
* **regression** when the loss is significantly larger than the minimum effect (the mirror test);
* otherwise **keep NCCL's defaults**.

The reported speedup is ``exp(mean d)`` with a t-based confidence interval on the log scale, the p-value
against "no gain", and each side's coefficient of variation.

Non-goals: choosing finalists and scheduling the re-measurements (``study``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from topo_tune.errors import ConfigError

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MIN_EFFECT",
    "Comparison",
    "Decision",
    "compare",
    "decide",
    "holm",
]

DEFAULT_ALPHA = 0.01
DEFAULT_MIN_EFFECT = 0.03
DEFAULT_CONFIDENCE = 0.99


class Decision(enum.Enum):
    PROMOTE = "promote"
    KEEP_DEFAULTS = "keep NCCL's defaults"
    REGRESSION = "regression"


@dataclass(frozen=True)
class Comparison:
    """Paired baseline/candidate times of one (collective, bucket), and what they prove."""

    speedup: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float  # H0: speedup <= 1 (no gain)
    p_margin: float  # H0: speedup <= 1 + min_effect
    p_loss: float  # H0: speedup >= 1 - min_effect
    cv_baseline: float
    cv_candidate: float
    pairs: int


def compare(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    confidence: float = DEFAULT_CONFIDENCE,
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
    if not 0 <= min_effect < 1:
        raise ConfigError("min_effect", f"must be within [0, 1), got {min_effect}")
    if not 0.5 < confidence < 1:
        raise ConfigError("confidence", f"must be within (0.5, 1), got {confidence}")
    n = len(baseline)
    diffs = [math.log(b / c) for b, c in zip(baseline, candidate, strict=True)]
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    gain_margin = math.log1p(min_effect)
    loss_margin = math.log1p(-min_effect)
    if se == 0.0:
        # Identical ratios in every pair (a deterministic backend): the sign of the difference is certain.
        p_value = 0.0 if mean > 0 else 1.0
        p_margin = 0.0 if mean > gain_margin else 1.0
        p_loss = 0.0 if mean < loss_margin else 1.0
        half = 0.0
    else:
        df = n - 1
        p_value = float(stats.t.sf(mean / se, df))
        p_margin = float(stats.t.sf((mean - gain_margin) / se, df))
        p_loss = float(stats.t.cdf((mean - loss_margin) / se, df))
        half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    return Comparison(
        speedup=math.exp(mean),
        ci_low=math.exp(mean - half),
        ci_high=math.exp(mean + half),
        confidence=confidence,
        p_value=p_value,
        p_margin=p_margin,
        p_loss=p_loss,
        cv_baseline=_cv(baseline),
        cv_candidate=_cv(candidate),
        pairs=n,
    )


def decide(comparisons: Sequence[Comparison], *, alpha: float = DEFAULT_ALPHA) -> list[Decision]:
    """One decision per comparison, Holm-corrected over all of them (a proof tests many buckets at once)."""
    if not 0 < alpha < 0.5:
        raise ConfigError("alpha", f"must be within (0, 0.5), got {alpha}")
    gains = holm([c.p_margin for c in comparisons], alpha)
    losses = holm([c.p_loss for c in comparisons], alpha)
    out = []
    for gain, loss in zip(gains, losses, strict=True):
        out.append(Decision.PROMOTE if gain else Decision.REGRESSION if loss else Decision.KEEP_DEFAULTS)
    return out


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm–Bonferroni: which hypotheses are rejected, keeping the family-wise error at ``alpha``."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, index in enumerate(order):
        if p_values[index] < alpha / (m - rank):
            rejected[index] = True
        else:
            break
    return rejected


def _cv(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean
