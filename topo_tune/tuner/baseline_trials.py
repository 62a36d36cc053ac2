"""The study's first trials: the baseline (NCCL's defaults), then the caller's candidates, each once.

Purpose: nothing is measured before the baseline (every value is a speedup over it); a baseline trial whose
worker died is measured again as often as the study is resumed, one whose measurement failed stops the study.
The caller's topology-derived candidates are enqueued once each, within the budget.

Non-goals: running a trial (``study``), proposing configurations (the sampler).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from topo_tune.errors import StudyError
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.trial_store import (
    A_ATTEMPT,
    A_CANDIDATE,
    A_FAILURE,
    A_MEASUREMENTS,
    A_REASON,
    A_RETRY_OF,
    A_ROLE,
    TrialRole,
    to_optuna,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from optuna.distributions import BaseDistribution

    from topo_tune.tuner.space import SearchSpace

__all__ = ["BaselineTrials", "Candidate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A configuration to try early, e.g. the ring-order optimizer's order with NCCL's defaults."""

    name: str
    params: Mapping[str, str]


class BaselineTrials:
    """The baseline and the candidates (a mixin of ``TunerStudy``: they run as the study's own trials)."""

    if TYPE_CHECKING:
        space: SearchSpace
        _poll_interval_s: float
        _name: str
        _budget: int
        _candidates: list[Candidate]
        _distributions: dict[str, BaseDistribution]
        _sleep: Callable[[float], None]

        def _run_trial(self, study: optuna.Study, trial: optuna.Trial, baseline: Measurements | None) -> None: ...

        def _reclaim_stale(self, study: optuna.Study) -> None: ...

    def _ensure_baseline(self, study: optuna.Study) -> Measurements:
        while True:
            trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(A_ROLE) == TrialRole.BASELINE]
            for t in trials:
                if t.state == TrialState.COMPLETE:
                    return Measurements.from_json(t.user_attrs[A_MEASUREMENTS])
            if not trials:
                study.enqueue_trial(
                    to_optuna(self.space, self.space.baseline_params()),
                    user_attrs={A_ROLE: TrialRole.BASELINE.value, A_ATTEMPT: 1},
                )
                continue
            if any(t.state == TrialState.WAITING for t in trials):
                self._run_trial(study, study.ask(self._distributions), None)
                continue
            if any(t.state == TrialState.RUNNING for t in trials):
                self._sleep(self._poll_interval_s)
                self._reclaim_stale(study)
                continue
            last = max(trials, key=lambda t: t.number)
            if last.user_attrs.get(A_FAILURE) == "stale":
                # Its worker died, the measurement did not fail: nothing runs without the baseline, so unlike a
                # trial of the search (retried once) it is measured again as often as the study is resumed.
                attempt = int(last.user_attrs.get(A_ATTEMPT, 1)) + 1
                study.enqueue_trial(
                    to_optuna(self.space, self.space.baseline_params()),
                    user_attrs={A_ROLE: TrialRole.BASELINE.value, A_ATTEMPT: attempt, A_RETRY_OF: last.number},
                )
                continue
            raise StudyError(
                f"the baseline (NCCL's defaults) could not be measured: "
                f"{last.user_attrs.get(A_FAILURE, 'failed')}: {last.user_attrs.get(A_REASON, 'no reason recorded')}"
            )

    def _enqueue_candidates(self, study: optuna.Study) -> None:
        room = max(self._budget - 1, 0)
        if len(self._candidates) > room:
            logger.warning(
                "study %s: %d candidates, budget leaves room for %d", self._name, len(self._candidates), room
            )
        existing = {t.user_attrs.get(A_CANDIDATE) for t in study.get_trials(deepcopy=False)}
        for candidate in self._candidates[:room]:
            if candidate.name in existing:
                continue
            study.enqueue_trial(
                to_optuna(self.space, candidate.params),
                user_attrs={A_ROLE: TrialRole.CANDIDATE.value, A_CANDIDATE: candidate.name, A_ATTEMPT: 1},
            )
