"""The measured baseline (NCCL's defaults) of a study in a topo-tune database, for weighing by time.

``topo-tune init`` stores every study in its database (``OUTPUT/.topo-tune/topo-tune.db``, or the
controller's); a study's baseline trial holds the time of every collective at every size of its ladder. The
newest study with a completed baseline is used unless one is named.

Non-goals: anything else of a study (the report reads those), and writing.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from topo_tune.errors import ConfigError
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.trial_store import A_MEASUREMENTS, A_ROLE, engine_kwargs

__all__ = ["study_baseline"]


def study_baseline(url: str, *, study: str | None = None) -> tuple[str, Measurements]:
    """``(study name, baseline measurements)``; :class:`ConfigError` naming ``--database`` when there is none."""
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url), skip_compatibility_check=True)
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    except Exception as error:  # SQLAlchemy and Optuna raise many kinds: one line for the user
        raise ConfigError("--database", f"cannot open {url}: {type(error).__name__}: {error}") from None
    names = [s.study_name for s in sorted(summaries, key=lambda s: s.datetime_start or 0, reverse=True)]
    if study is not None:
        if study not in names:
            raise ConfigError("--study", f"no study {study!r} in {url}; studies: {', '.join(names) or 'none'}")
        names = [study]
    for name in names:
        loaded = optuna.load_study(study_name=name, storage=storage)
        for trial in loaded.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if trial.user_attrs.get(A_ROLE) == "baseline" and A_MEASUREMENTS in trial.user_attrs:
                return name, Measurements.from_json(trial.user_attrs[A_MEASUREMENTS])
    raise ConfigError("--database", f"no study in {url} has a measured baseline")
