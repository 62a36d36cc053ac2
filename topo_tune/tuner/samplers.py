"""The study's samplers: TPE (the default), random, CMA-ES and coordinate descent, seeded.

Non-goals: the search space (``space``) and running trials (``study``).
"""

from __future__ import annotations

from typing import get_args

import optuna

from topo_tune.config.cluster import SamplerName
from topo_tune.tuner.coordinate_descent import CoordinateDescentSampler
from topo_tune.tuner.space import SearchSpace
from topo_tune.tuner.trial_store import distributions

__all__ = ["SAMPLERS", "SamplerName", "make_sampler"]

SAMPLERS: tuple[SamplerName, ...] = get_args(SamplerName)


def make_sampler(
    name: SamplerName, space: SearchSpace, *, seed: int, startup: int, ei_candidates: int
) -> optuna.samplers.BaseSampler:
    """The sampler ``name``; ``startup`` random trials before TPE or CMA-ES model, TPE's ``ei_candidates``."""
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=startup,
            n_ei_candidates=ei_candidates,
            multivariate=True,
            group=False,
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        # CMA-ES models the ordered (integer) dimensions; categorical ones fall back to random sampling.
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=startup, warn_independent_sampling=False)
    return CoordinateDescentSampler(distributions(space), seed=seed)
