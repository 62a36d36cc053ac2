"""The study's table trials: a channel table from the search's per-bucket winners, and the per-size search.

Purpose: after the environment/order search, measure (once per study, resumably) the tuner-plugin table
composed from the search's per-bucket channel winners (``plugin_table``), and NCCL's per-bucket options for
the best bases with each base's composed table (``size_options``). Each is a trial of the study like any
other, and a finalist of the proof like any other.

Non-goals: composing tables (``plugin_table``, ``size_options``), running a trial (``study``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, TrialState

from topo_tune.tuner import size_options
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.plugin_table import ScoredTrial, compose_table
from topo_tune.tuner.trial_store import (
    A_ATTEMPT,
    A_CANDIDATE,
    A_MEASUREMENTS,
    A_ROLE,
    A_TABLE,
    TrialRole,
    TrialRunner,
    has_every_param,
    logical_trials,
    role_of,
    to_optuna,
)

if TYPE_CHECKING:
    from topo_tune.tuner.objective import Objective
    from topo_tune.tuner.space import SearchSpace

__all__ = ["TableTrials"]

logger = logging.getLogger(__name__)


class TableTrials:
    """Table and per-size trials: run as the study's own trials, through its ``TrialRunner``."""

    def __init__(
        self,
        space: SearchSpace,
        *,
        objective: Objective,
        name: str,
        table_shape: tuple[int, int] | None,
        runner: TrialRunner,
    ) -> None:
        self.space = space
        self.objective = objective
        self.name = name
        self.table_shape = table_shape
        """The jobs' (nodes, ranks) a table is composed for; None: no table trials."""
        self.runner = runner

    def table_trial(self, study: optuna.Study, baseline: Measurements) -> None:
        """Compose a table from the search's per-bucket winners and measure it, once per study."""
        if self.table_shape is None:
            return
        while True:
            trials = [t for t in study.get_trials(deepcopy=False) if role_of(t.user_attrs) is TrialRole.TABLE]
            if any(t.state == TrialState.WAITING for t in trials):
                self.runner.run_next(study, baseline)
                continue
            if trials:
                return  # measured (or failed, or left to another worker's retry): the proof takes it from here
            searched = [
                ScoredTrial(
                    t.number, self.runner.config_of(t.params, t.user_attrs).env, t.value, Measurements.from_json(raw)
                )
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if role_of(t.user_attrs) is not TrialRole.BASELINE
                and t.value is not None
                and (raw := t.user_attrs.get(A_MEASUREMENTS))
            ]
            nodes, ranks = self.table_shape
            composed = compose_table(searched, baseline, self.objective, nodes=nodes, ranks=ranks)
            if composed is None:
                logger.info("study %s: no size bucket asks for its own channel count; no table trial", self.name)
                return
            base = self.runner.config_of(study.trials[composed.base_trial].params, {})
            params = self.space.params_for(
                env={k: v for k, v in composed.env.items() if k not in self.space.site_fixed},
                rank_order=base.rank_order.name,
            )
            for row in composed.rows:
                logger.info(
                    "table row: %s %s -> %d channels (trial %d, %.3fx in that bucket)",
                    row.collective,
                    row.bucket.name,
                    row.channels,
                    row.winner,
                    row.speedup,
                )
            study.enqueue_trial(
                to_optuna(self.space, params),
                user_attrs={A_ROLE: TrialRole.TABLE.value, A_TABLE: composed.text, A_ATTEMPT: 1},
            )

    # ---------------------------------------------------------------- per-size search (size_options)

    def per_size_trials(self, study: optuna.Study, baseline: Measurements) -> None:
        """Measure NCCL's per-bucket options for the best bases, then each base's composed table, once."""
        if self.table_shape is None:
            return
        nodes, ranks = self.table_shape
        while True:
            trials = study.get_trials(deepcopy=False)
            if any(t.state == TrialState.WAITING and role_of(t.user_attrs) in size_options.ROLES for t in trials):
                self.runner.run_next(study, baseline)
                continue
            stored = [self._stored(t) for t in logical_trials(trials) if has_every_param(self.space, t.params)]
            planned, pending = size_options.plan_next(stored, baseline, self.objective, nodes=nodes, ranks=ranks)
            for trial in planned:
                logger.info("study %s: per-size %s (base trial %d)", self.name, trial.key, trial.base)
                attrs = {A_ROLE: trial.role, A_CANDIDATE: trial.key, A_TABLE: trial.table, A_ATTEMPT: 1}
                study.enqueue_trial(dict(trial.params), user_attrs=attrs)
            if planned:
                continue
            if not pending:
                return
            self.runner.wait_for_others(study)  # another worker's option trial: wait for it or its staleness

    def _env_of(self, t: FrozenTrial) -> Mapping[str, str]:
        return self.runner.config_of(t.params, t.user_attrs).env

    def _stored(self, t: FrozenTrial) -> size_options.StoredTrial:
        raw = t.user_attrs.get(A_MEASUREMENTS)
        config = self.runner.config_of(t.params, {})
        return size_options.StoredTrial(
            number=t.number,
            role=role_of(t.user_attrs),
            key=str(t.user_attrs.get(A_CANDIDATE, "")),
            finished=t.state.is_finished(),
            value=t.value if t.state == TrialState.COMPLETE else None,
            env=config.env,
            rank_order=config.rank_order.name,
            params=t.params,
            measurements=Measurements.from_json(raw) if raw and t.state == TrialState.COMPLETE else None,
            table=str(t.user_attrs.get(A_TABLE, "")),
        )
