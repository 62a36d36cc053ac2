"""The study's pieces stand alone: each is built from plain values and a TrialRunner, and tested without a study."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tests.tuner.landscape import synthetic_space
from topo_tune.errors import StudyError
from topo_tune.tuner.baseline_trials import BaselineTrials, Candidate
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.space import TrialConfig
from topo_tune.tuner.stale_trials import StaleTrials
from topo_tune.tuner.trial_store import A_FAILURE, A_HEARTBEAT, A_RETRY_OF, A_ROLE, A_WORKER, TrialRole, role_of


def _study(tmp_path: Path) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    return optuna.create_study(study_name="pieces", storage=storage, direction="maximize"), storage


class FailingRunner:
    """Runs each asked trial and fails it, as a benchmark that cannot run would."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run_next(self, study: optuna.Study, baseline: Measurements | None) -> None:
        trial = study.ask()
        self.ran.append(str(trial.user_attrs.get(A_ROLE)))
        trial.set_user_attr(A_FAILURE, "failed")
        study.tell(trial, state=TrialState.FAIL)

    def wait_for_others(self, study: optuna.Study) -> None:
        raise AssertionError("nothing else runs")

    def config_of(self, params: Mapping[str, Any], attrs: Mapping[str, Any]) -> TrialConfig:
        raise AssertionError("not needed")


def test_the_baseline_piece_runs_the_baseline_first_and_stops_the_study_when_it_fails(tmp_path: Path) -> None:
    study, _ = _study(tmp_path)
    runner = FailingRunner()
    space = synthetic_space()
    pieces = BaselineTrials(space, name="pieces", budget=3, candidates=(), runner=runner)
    with pytest.raises(StudyError, match=r"baseline .* could not be measured: failed"):
        pieces.ensure(study)
    assert runner.ran == [TrialRole.BASELINE.value]


def test_the_candidates_fit_the_budget_and_are_enqueued_once(tmp_path: Path) -> None:
    study, _ = _study(tmp_path)
    space = synthetic_space()
    candidates = [Candidate(f"c{i}", space.baseline_params()) for i in range(4)]
    pieces = BaselineTrials(space, name="pieces", budget=3, candidates=candidates, runner=FailingRunner())
    pieces.enqueue_candidates(study)
    pieces.enqueue_candidates(study)
    waiting = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert [role_of(t.user_attrs) for t in waiting] == [TrialRole.CANDIDATE, TrialRole.CANDIDATE]


def test_the_stale_piece_fails_a_silent_trial_and_retries_it_once(tmp_path: Path) -> None:
    study, storage = _study(tmp_path)
    trial = study.ask()
    trial.set_user_attr(A_WORKER, "other")
    trial.set_user_attr(A_HEARTBEAT, 100.0)
    stale = StaleTrials(
        synthetic_space(), worker_id="me", stale_after_s=30.0, clock=lambda: 200.0, runs_here=lambda n: False
    )
    stale.reclaim(study, storage)
    stale.reclaim(study, storage)
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs[A_FAILURE] == "stale"
    assert [t.user_attrs.get(A_RETRY_OF) for t in trials[1:]] == [0], "retried exactly once"

    running_here = StaleTrials(
        synthetic_space(), worker_id="me", stale_after_s=30.0, clock=lambda: 200.0, runs_here=lambda n: True
    )
    second = study.ask()
    second.set_user_attr(A_WORKER, "me")
    running_here.reclaim(study, storage)
    assert study.get_trials()[second.number].state == TrialState.RUNNING, "a trial this process runs is not stale"
