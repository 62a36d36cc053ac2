"""Coordinate descent as an Optuna sampler: AutoCCL's search method, for comparison with TPE.

Purpose: from the best trial so far (the incumbent), sweep one dimension at a time over all its values with
the others fixed; move to the best point of the line and continue with the next dimension, until no
line through the incumbent holds an unmeasured point. Then it falls back to seeded random sampling.

The sampler keeps no state of its own: every proposal is derived from the study's trials (the incumbent,
the points already tried, and the dimension each proposal varied, kept as a trial system attribute). A
resumed study therefore continues the same descent.

Non-goals: continuous dimensions (the search space is discrete) and multi-objective studies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

__all__ = ["CoordinateDescentSampler"]

_DIM_ATTR = "coordinate_descent_dimension"


class CoordinateDescentSampler(BaseSampler):
    """Proposes the next unmeasured point on the incumbent's coordinate lines, dimension by dimension."""

    def __init__(self, distributions: Mapping[str, BaseDistribution], *, seed: int) -> None:
        self._distributions = dict(distributions)
        self._names: Sequence[str] = list(distributions)
        self._fallback = RandomSampler(seed=seed)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._distributions)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        complete = [t for t in others if t.state == TrialState.COMPLETE and t.value is not None]
        if not complete or not search_space:
            return {}
        incumbent = max(complete, key=lambda t: (t.value, -t.number))
        seen = {_key(t.params) for t in others if t.params}
        seen |= {_key(t.system_attrs["fixed_params"]) for t in others if "fixed_params" in t.system_attrs}
        start = int(incumbent.system_attrs.get(_DIM_ATTR, 0))
        names = [n for n in self._names if n in search_space]
        for offset in range(len(names)):
            index = (start + offset) % len(names)
            name = names[index]
            for value in _values(search_space[name]):
                candidate = dict(incumbent.params)
                candidate[name] = value
                if _key(candidate) not in seen:
                    study._storage.set_trial_system_attr(trial._trial_id, _DIM_ATTR, index)
                    return candidate
        return {}  # converged: every line through the incumbent is measured

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


def _values(distribution: BaseDistribution) -> list[Any]:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return list(distribution.choices)
    if isinstance(distribution, optuna.distributions.IntDistribution):
        return list(range(distribution.low, distribution.high + 1, distribution.step))
    raise TypeError(f"coordinate descent needs discrete dimensions, got {distribution!r}")


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))
