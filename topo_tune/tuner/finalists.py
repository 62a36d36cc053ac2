"""Which searched trials the proof re-measures, in which order.

Purpose: the best trial by search value first (it may trade a loss in some bucket for a gain elsewhere:
proven, it is named as the trade-off), then the composed tables that looked safe (built from per-bucket
winners, the likeliest to be safe everywhere), then the other trials that looked safe (best first), then the
tables that did not, then the rest by value; the baseline's configuration and repeats never. A table whose
own search run showed a loss in some bucket takes no slot from a trial that showed none: built on a base that
trades sizes against each other, it usually keeps the base's loss where no row beat the base.

"Looked safe" is one rule, shared with the sampler's constraint (``shortfall``): the trial's one search
measurement was within ``maxLoss`` plus ``SEARCH_SLACK`` in every weighted bucket. One run of a small size is
a few percent noisy, so a configuration truly within 1% of the defaults there fails a bare ``maxLoss`` test
about as often as not, and was then left out of the proof, which alone decides with the noise accounted for.

Non-goals: proving (``proof``), searching (``study``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial

from topo_tune.tuner import size_options
from topo_tune.tuner.objective import Measurements, Objective
from topo_tune.tuner.trial_store import A_MEASUREMENTS, A_ROLE, A_TABLE

__all__ = ["SEARCH_SLACK", "choose_finalists", "looked_safe", "shortfall"]

SEARCH_SLACK = 0.01
"""How far below ``1 - maxLoss`` one search measurement of a bucket may fall and the trial still look safe (to
the sampler's constraint and to the choice of finalists): a single run of a small size is a few percent noisy."""


def choose_finalists(
    complete: Sequence[FrozenTrial],
    baseline: Measurements,
    *,
    baseline_params: Mapping[str, Any],
    objective: Objective,
    max_loss: float,
    count: int,
) -> list[FrozenTrial]:
    """Up to ``count`` of the completed trials that beat the baseline's value, in the order above."""
    seen: set[tuple[tuple[str, Any], ...]] = set()  # params and table: a table trial is its own finalist
    baseline_key = (*sorted(baseline_params.items()), (A_TABLE, ""))
    ranked = []
    for t in sorted(complete, key=lambda t: (-(t.value or 0.0), t.number)):
        key = (*sorted(t.params.items()), (A_TABLE, t.user_attrs.get(A_TABLE, "")))
        if t.user_attrs.get(A_ROLE) == "baseline" or key == baseline_key or key in seen:
            continue
        if t.value is None or t.value <= 1.0:
            break
        seen.add(key)
        ranked.append(t)
    tables = [t for t in ranked if t.user_attrs.get(A_ROLE) in ("table", size_options.ROLE_COMPOSED)]
    safe = [t for t in ranked if looked_safe(t, baseline, objective, max_loss)]
    out: list[FrozenTrial] = []
    for t in [*ranked[:1], *[t for t in tables if t in safe], *safe, *tables, *ranked]:
        if t not in out:
            out.append(t)
    return out[:count]


def shortfall(measured: Measurements, baseline: Measurements, objective: Objective, max_loss: float) -> float:
    """How far the worst weighted bucket fell below ``1 - max_loss - SEARCH_SLACK`` (<= 0: it looked safe)."""
    return _shortfall(_weighted_speedups(measured, baseline, objective), max_loss)


def looked_safe(trial: FrozenTrial, baseline: Measurements, objective: Objective, max_loss: float) -> bool:
    """Whether the trial's one search measurement looked safe (``shortfall`` <= 0) in every weighted bucket."""
    raw = trial.user_attrs.get(A_MEASUREMENTS)
    if not raw:
        return False
    speedups = _weighted_speedups(Measurements.from_json(raw), baseline, objective)
    return bool(speedups) and _shortfall(speedups, max_loss) <= 0


def _shortfall(speedups: list[float], max_loss: float) -> float:
    return 1 - max_loss - SEARCH_SLACK - min(speedups, default=1.0)


def _weighted_speedups(measured: Measurements, baseline: Measurements, objective: Objective) -> list[float]:
    scores = objective.bucket_scores(measured, baseline)
    return [s.speedup for s in scores if objective.profile.weight(s.collective, s.bucket.name) > 0]
