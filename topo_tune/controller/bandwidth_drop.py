"""Is a bus-bandwidth drop beyond a margin real, or noise? Welch's t-test on log bandwidth, one-sided.

A drift check has two independent samples: the figures its version's rollout gate measured (the
reference, one per A/B repeat) and the figures it measures now (one per benchmark job). Neither is paired
with the other and their spreads differ (another day, other nodes of the wave), so the test is Welch's:
on ``ln(busbw)``, H0 "the bandwidth fell by at most ``margin``" (``mean ln measured - mean ln reference >=
ln(1 - margin)``) against "it fell by more". Logs make the margin a ratio and tame the long right tail of
bandwidth figures. A side with a single figure is taken as known (it adds no variance; the test becomes
a one-sample t-test on the other side), and two sides without spread (a deterministic backend) decide by
the sign alone.

Non-goals: choosing nodes and running the benchmark (``drift/checker.py``), and paired A/B comparisons (the gates'
sign-flip test in ``rollout/gates.py``, the proof's t-test in ``tuner/statistics.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, variance

from topo_tune.errors import ValidationError

__all__ = ["DropTest", "drop_beyond"]


@dataclass(frozen=True)
class DropTest:
    drop: float
    """``1 - geometric mean(measured) / geometric mean(reference)``: positive is slower."""
    p_value: float
    """One-sided p-value of H0 "the drop is at most the margin"."""
    df: float
    """Welch–Satterthwaite degrees of freedom (``inf`` when neither side has spread)."""


def drop_beyond(reference: Sequence[float], measured: Sequence[float], *, margin: float) -> DropTest:
    """Test whether ``measured`` bandwidth is more than ``margin`` (a fraction) below ``reference``.

    Raises:
        ValidationError: a side is empty, a figure is not a positive finite number, or the margin is not in [0, 1).
    """
    if not 0 <= margin < 1:
        raise ValidationError("margin", f"a fraction in [0, 1), got {margin:g}")
    sides = []
    for name, values in (("reference", reference), ("measured", measured)):
        if not values:
            raise ValidationError(name, "needs at least one bandwidth figure")
        bad = [v for v in values if not (v > 0 and math.isfinite(v))]
        if bad:
            raise ValidationError(name, f"bandwidth figures must be finite and > 0, got {bad[0]!r}")
        sides.append([math.log(v) for v in values])
    logs_reference, logs_measured = sides
    shift = fmean(logs_measured) - fmean(logs_reference) - math.log1p(-margin)  # < 0: beyond the margin
    drop = 1 - math.exp(fmean(logs_measured) - fmean(logs_reference))
    # Each side's share of the variance of the difference of means; a single figure is taken as exact.
    shares = [(variance(logs) / len(logs), len(logs) - 1) for logs in sides if len(logs) > 1]
    se2 = sum(share for share, _ in shares)
    if se2 == 0:
        return DropTest(drop=drop, p_value=0.0 if shift < 0 else 1.0, df=math.inf)
    from scipy import stats  # noqa: PLC0415 - SciPy's stats take a second to load; the controller loads this module on every start

    df = se2**2 / sum(share**2 / dof for share, dof in shares if share > 0)
    return DropTest(drop=drop, p_value=float(stats.t.cdf(shift / math.sqrt(se2), df)), df=df)
