"""Which searched trials the proof re-measures, in which order.

Purpose: the best trial by search value first (it may trade a loss in some bucket for a gain elsewhere:
proven, it is named as the trade-off), then the composed tables that looked safe (built from per-bucket
winners, the likeliest to be safe everywhere), then the other trials that looked safe (best first), then the
tables that did not, then the rest by value; the baseline's configuration and repeats never. A table whose
own search run showed a loss in some bucket takes no slot from a trial that showed none: built on a base that
trades sizes against each other, it usually keeps the base's loss where no row beat the base.

"Looked safe": the trial's one search measurement was within ``maxLoss`` plus ``SEARCH_SLACK`` in every
weighted bucket (``shortfall``, also the sampler's constraint), or, where the search measured some
configurations more than once, within ``NOISE_Z`` of that bucket's measured one-run spread below
``1 - maxLoss`` (``search_noise``; only ever wider than the slack). One run of a small size is a few percent
noisy, so a configuration truly within 1% of the defaults there fails a bare ``maxLoss`` test about as often
as not, and was then left out of the proof, which alone decides with the noise accounted for. The sampler's
constraint keeps the fixed slack: it is computed as each trial ends, from that trial alone.

Non-goals: proving (``proof``), searching (``study``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial

from topo_tune.tuner.objective import Measurements, Objective
from topo_tune.tuner.trial_store import A_MEASUREMENTS, A_TABLE, TrialRole, role_of

__all__ = ["MIN_REPEATS", "NOISE_Z", "SEARCH_SLACK", "choose_finalists", "looked_safe", "search_noise", "shortfall"]

NOISE_Z = 2.0
"""How many one-run deviations (``search_noise``) below ``1 - maxLoss`` a bucket may fall and still look safe.
A run is compared with the one baseline run, so its ratio spreads about sqrt(2) deviations: a bucket truly at
``1 - maxLoss`` looks safe in about 92% of runs."""
MIN_REPEATS = 4
"""Degrees of freedom (repeat runs beyond the first of each configuration) ``search_noise`` needs."""
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
    seen: set[tuple[tuple[str, Any], ...]] = set()
    baseline_key = (*sorted(baseline_params.items()), (A_TABLE, ""))
    ranked = []
    for t in sorted(complete, key=lambda t: (-(t.value or 0.0), t.number)):
        key = _config_key(t)
        if role_of(t.user_attrs) is TrialRole.BASELINE or key == baseline_key or key in seen:
            continue
        if t.value is None or t.value <= 1.0:
            break
        seen.add(key)
        ranked.append(t)
    tables = [t for t in ranked if role_of(t.user_attrs) in (TrialRole.TABLE, TrialRole.PER_SIZE)]
    noise = search_noise(complete, baseline, objective)
    safe = [t for t in ranked if looked_safe(t, baseline, objective=objective, max_loss=max_loss, noise=noise)]
    out: list[FrozenTrial] = []
    for t in [*ranked[:1], *[t for t in tables if t in safe], *safe, *tables, *ranked]:
        if t not in out:
            out.append(t)
    return out[:count]


def shortfall(
    measured: Measurements,
    baseline: Measurements,
    *,
    objective: Objective,
    max_loss: float,
    noise: Mapping[tuple[str, str], float] | None = None,
) -> float:
    """How far the worst weighted bucket fell below its looked-safe floor (<= 0: it looked safe).

    The floor is ``1 - max_loss - SEARCH_SLACK``, or, with ``noise`` (``search_noise``) for the bucket, ``NOISE_Z``
    of its one-run deviations below ``1 - max_loss`` where that is lower.
    """
    return _gap(_weighted_scores(measured, baseline, objective), max_loss, noise)


def looked_safe(
    trial: FrozenTrial,
    baseline: Measurements,
    *,
    objective: Objective,
    max_loss: float,
    noise: Mapping[tuple[str, str], float] | None = None,
) -> bool:
    """Whether the trial's one search measurement looked safe (``shortfall`` <= 0) in every weighted bucket."""
    raw = trial.user_attrs.get(A_MEASUREMENTS)
    if not raw:
        return False
    scores = _weighted_scores(Measurements.from_json(raw), baseline, objective)
    return bool(scores) and _gap(scores, max_loss, noise) <= 0


def _gap(
    scores: Mapping[tuple[str, str], float], max_loss: float, noise: Mapping[tuple[str, str], float] | None
) -> float:
    return max((_floor(key, max_loss, noise) - s for key, s in scores.items()), default=-max_loss - SEARCH_SLACK)


def _floor(key: tuple[str, str], max_loss: float, noise: Mapping[tuple[str, str], float] | None) -> float:
    floor = 1 - max_loss - SEARCH_SLACK
    if noise and key in noise:
        floor = min(floor, (1 - max_loss) * math.exp(-NOISE_Z * noise[key]))
    return floor


def search_noise(
    complete: Sequence[FrozenTrial], baseline: Measurements, objective: Objective
) -> dict[tuple[str, str], float]:
    """Per weighted bucket: the pooled standard deviation of one search run's log speedup.

    From the configurations the search measured more than once (same params and table); empty with fewer
    than ``MIN_REPEATS`` degrees of freedom.
    """
    groups: dict[tuple[tuple[str, Any], ...], list[dict[tuple[str, str], float]]] = {}
    for t in complete:
        raw = t.user_attrs.get(A_MEASUREMENTS)
        if not raw:
            continue
        scores = _weighted_scores(Measurements.from_json(raw), baseline, objective)
        groups.setdefault(_config_key(t), []).append({k: math.log(v) for k, v in scores.items()})
    squares: dict[tuple[str, str], float] = {}
    df: dict[tuple[str, str], int] = {}
    for runs in groups.values():
        for bucket in set().union(*runs):
            values = [r[bucket] for r in runs if bucket in r]
            if len(values) < 2:
                continue
            mean = sum(values) / len(values)
            squares[bucket] = squares.get(bucket, 0.0) + sum((v - mean) ** 2 for v in values)
            df[bucket] = df.get(bucket, 0) + len(values) - 1
    return {b: math.sqrt(squares[b] / df[b]) for b in squares if df[b] >= MIN_REPEATS}


def _config_key(t: FrozenTrial) -> tuple[tuple[str, Any], ...]:
    """Params and table: a table trial is a configuration of its own."""
    return (*sorted(t.params.items()), (A_TABLE, t.user_attrs.get(A_TABLE, "")))


def _weighted_scores(
    measured: Measurements, baseline: Measurements, objective: Objective
) -> dict[tuple[str, str], float]:
    scores = objective.bucket_scores(measured, baseline)
    return {
        (s.collective, s.bucket.name): s.speedup
        for s in scores
        if objective.profile.weight(s.collective, s.bucket.name) > 0
    }
