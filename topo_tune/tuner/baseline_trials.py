"""The study's first trials: the baseline (NCCL's defaults), then the caller's candidates, each once.

Purpose: nothing is measured before the baseline (every value is a speedup over it); a baseline trial whose
worker died is measured again as often as the study is resumed, one whose measurement failed stops the study.
The caller's topology-derived candidates are enqueued once each, within the budget.

Non-goals: running a trial (``study``), proposing configurations (the sampler).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
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
    TrialRunner,
    to_optuna,
)

if TYPE_CHECKING:
    from topo_tune.tuner.space import SearchSpace

__all__ = ["BaselineTrials", "Candidate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A configuration to try early, e.g. the ring-order optimizer's order with NCCL's defaults."""

    name: str
    params: Mapping[str, str]


class BaselineTrials:
    """The baseline and the candidates: run as the study's own trials, through its ``TrialRunner``."""

    def __init__(
        self, space: SearchSpace, *, name: str, budget: int, candidates: Sequence[Candidate], runner: TrialRunner
    ) -> None:
        self.space = space
        self.name = name
        self.budget = budget
        self.candidates = list(candidates)
        self.runner = runner

    def ensure(self, study: optuna.Study) -> Measurements:
        """The baseline's measurements: measured first (again, where its worker died), else a ``StudyError``."""
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
                self.runner.run_next(study, None)
                continue
            if any(t.state == TrialState.RUNNING for t in trials):
                self.runner.wait_for_others(study)
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

    def enqueue_candidates(self, study: optuna.Study) -> None:
        """The caller's candidates, each once, within the budget (the baseline takes one trial of it)."""
        room = max(self.budget - 1, 0)
        if len(self.candidates) > room:
            logger.warning("study %s: %d candidates, budget leaves room for %d", self.name, len(self.candidates), room)
        existing = {t.user_attrs.get(A_CANDIDATE) for t in study.get_trials(deepcopy=False)}
        for candidate in self.candidates[:room]:
            if candidate.name in existing:
                continue
            study.enqueue_trial(
                to_optuna(self.space, candidate.params),
                user_attrs={A_ROLE: TrialRole.CANDIDATE.value, A_CANDIDATE: candidate.name, A_ATTEMPT: 1},
            )
