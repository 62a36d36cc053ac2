"""A tuning study: Optuna ask/tell over the search space, persisted in RDB storage, then the proof.

Purpose: run one study end to end, resumable at any point.

1. The **baseline** (every knob unset, NCCL's natural order) is measured first; its value is 1.0 by
   definition. Only then are the caller's topology-derived **candidates** enqueued, then the sampler (TPE,
   seeded, by default) proposes the rest of the budget.
2. Each trial is measured rung by rung along the size ladder (small sizes first); after each rung the
   partial objective is reported as an intermediate value, and a trial whose partial speedup is hopeless
   next to the best completed trials at that rung is **pruned**, saving its large sizes (never an option
   trial of the per-size search: it is meant to lose in some buckets).
3. A measurement that fails, returns a wrong result or times out raises :class:`TrialFailed`; the trial is
   recorded as failed with the kind and reason in its user attributes, and never chosen.
4. **Stale trials** (``stale_trials``): a running trial whose worker is gone is failed as ``stale`` and
   enqueued again once. A study killed at any point and run again with the same settings finishes with
   every trial counted once: waiting trials are picked up, stale ones retried once, and the enqueueing
   steps are idempotent.
5. The **table trials** (``table_trials``): a channel table and the per-size search through the plugin.
6. The **proof** (``proof``): the finalists (``finalists``) are re-measured interleaved with the baseline; a
   finalist is chosen only when every weighted (collective, bucket) is shown safe and one is shown faster.

The search is Optuna's constrained TPE: each trial's constraint is how far its worst weighted bucket fell
below ``1 - maxLoss`` (less ``SEARCH_SLACK`` for one noisy run), so the sampler models where a configuration
could pass the proof, not only where the weighted speedup is highest.

The measurement is injected (:class:`Evaluator`), as are the clock and the sleep used while waiting for
another worker's trial, so the controller plugs in real benchmark jobs and tests a model.

Non-goals: dispatching benchmark jobs, writing output files (``outputs``), keying results by cluster.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import optuna
from optuna.trial import TrialState

from topo_tune.errors import ConfigError, FailureKind, StudyError, TrialFailed
from topo_tune.tuner.baseline_trials import BaselineTrials, Candidate
from topo_tune.tuner.evaluation import Evaluator, MeasurementRequest, requested
from topo_tune.tuner.finalists import SEARCH_SLACK, choose_finalists, shortfall
from topo_tune.tuner.objective import Measurements, Objective
from topo_tune.tuner.proof import SMALL_RUNS, FinalistProof, ProofSettings, Prover
from topo_tune.tuner.samplers import SamplerName, make_sampler
from topo_tune.tuner.space import SearchSpace, TrialConfig
from topo_tune.tuner.stale_trials import StaleTrials
from topo_tune.tuner.study_records import StudyOutcome, StudyProgress, study_outcome, study_progress
from topo_tune.tuner.study_settings import StudySettings
from topo_tune.tuner.table_trials import TableTrials
from topo_tune.tuner.trial_store import (
    A_FAILURE,
    A_HEARTBEAT,
    A_MEASUREMENTS,
    A_REASON,
    A_WORKER,
    C_BUCKET_FLOOR,
    S_FINGERPRINT,
    S_MEASURED,
    S_RANK_ORDERS,
    Heartbeat,
    TrialRole,
    distributions,
    engine_kwargs,
    logical_trials,
    measured_key,
    role_of,
    stored_rank_orders,
    to_optuna,
    trial_config,
    trial_id,
)

__all__ = [
    "A_FAILURE",
    "A_REASON",
    "SEARCH_SLACK",
    "Candidate",
    "FailureKind",
    "MeasurementRequest",
    "SamplerName",
    "StudyError",
    "StudyOutcome",
    "StudyProgress",
    "StudySettings",
    "TrialFailed",
    "TunerStudy",
    "run_study",
    "stored_rank_orders",
]

logger = logging.getLogger(__name__)


class TunerStudy:
    """One study over ``space``, scored by ``objective``, measured by ``evaluate``.

    It holds its pieces (the baseline and candidates, the stale-trial reclaim, the table trials) and they call
    back only through :class:`~topo_tune.tuner.trial_store.TrialRunner`, which the study implements."""

    def __init__(
        self,
        settings: StudySettings,
        *,
        space: SearchSpace,
        objective: Objective,
        evaluate: Evaluator,
        candidates: Sequence[Candidate] = (),
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        on_progress: Callable[[StudyProgress], None] | None = None,
    ) -> None:
        self.settings = settings
        self.space = space
        self.objective = objective
        self._evaluate = evaluate
        self._clock = clock
        self._sleep = sleep
        self._on_progress = on_progress
        self._distributions = distributions(space)
        # Trials measure only the sizes the workload weighs: an imported trace's unused buckets cost no trial time.
        self._rungs = objective.rungs(objective.weighted_sizes(settings.ladder) or settings.ladder, settings.rungs)
        self._active: set[int] = set()
        self._storages: list[optuna.storages.RDBStorage] = []
        self._storage: optuna.storages.RDBStorage  # the one open() opened last
        self._started = clock()
        self._finished_here = 0
        names = [c.name for c in candidates]
        if len(set(names)) != len(names):
            raise ConfigError("candidates", f"names must be unique, got {names}")
        for c in candidates:
            space.config(c.params)  # refuses values outside the space, naming the dimension
        self.baseline_trials = BaselineTrials(
            space, name=settings.name, budget=settings.budget, candidates=candidates, runner=self
        )
        self.stale_trials = StaleTrials(
            space,
            worker_id=settings.worker_id,
            stale_after_s=settings.stale_after_s,
            clock=clock,
            runs_here=self._active.__contains__,
        )
        self.table_trials = TableTrials(
            space, objective=objective, name=settings.name, table_shape=settings.table_shape, runner=self
        )

    # ---------------------------------------------------------------- study lifecycle

    def open(self) -> optuna.Study:
        """Create the study, or load it when it exists (then it must have been made for the same space)."""
        storage = optuna.storages.RDBStorage(self.settings.storage, engine_kwargs=engine_kwargs(self.settings.storage))
        self._storages.append(storage)
        self._storage = storage
        study = optuna.create_study(
            study_name=self.settings.name,
            storage=storage,
            sampler=make_sampler(
                self.settings.sampler,
                self.space,
                seed=self.settings.seed,
                startup=self.settings.tpe_startup,
                ei_candidates=self.settings.tpe_ei_candidates,
            ),
            direction="maximize",
            load_if_exists=True,
        )
        space_then = study.user_attrs.get(S_FINGERPRINT)
        if space_then is None:
            study.set_user_attr(S_RANK_ORDERS, json.dumps([[o.name, list(o.nodes)] for o in self.space.rank_orders]))
            study.set_user_attr(S_FINGERPRINT, self.space.fingerprint())
        elif space_then != self.space.fingerprint():
            raise StudyError(
                f"study {self.settings.name!r} was started with search space {space_then}, not "
                f"{self.space.fingerprint()}; start a new study to search a different space"
            )
        # Stored measurements, values and proof pairs hold the sizes and collectives they were measured for:
        # resuming with others would mix them (or find a stored proof pair without a size it now needs).
        measured = measured_key(self.settings.ladder, self.objective)
        measured_then = study.user_attrs.get(S_MEASURED)
        if measured_then is None:
            study.set_user_attr(S_MEASURED, measured)
        elif measured_then != measured:
            raise StudyError(
                f"study {self.settings.name!r} was measured for {measured_then}, not {measured}; start a new study to "
                "measure other sizes or another workload"
            )
        return study

    def _trial_id(self, study: optuna.Study, number: int) -> int:
        return trial_id(self._storage, study, number)

    # ---------------------------------------------------------------- what the pieces call (TrialRunner)

    def run_next(self, study: optuna.Study, baseline: Measurements | None) -> None:
        self._run_trial(study, study.ask(self._distributions), baseline)

    def wait_for_others(self, study: optuna.Study) -> None:
        self._sleep(self.settings.poll_interval_s)
        self._reclaim_stale(study)

    def config_of(self, params: Mapping[str, Any], attrs: Mapping[str, Any]) -> TrialConfig:
        return trial_config(self.space, params, attrs)

    def _reclaim_stale(self, study: optuna.Study) -> None:
        self.stale_trials.reclaim(study, self._storage)

    def close(self) -> None:
        """Close the database connections the study opened."""
        for storage in self._storages:
            storage.engine.dispose()
        self._storages.clear()

    def run(self) -> StudyOutcome:
        """Search, prove, and return the outcome. Safe to call again after a crash: it resumes."""
        try:
            return self._run(self.open())
        finally:
            self.close()

    def _run(self, study: optuna.Study) -> StudyOutcome:
        self._reclaim_stale(study)
        baseline = self.baseline_trials.ensure(study)
        self.baseline_trials.enqueue_candidates(study)
        while True:
            self._reclaim_stale(study)
            trials = study.get_trials(deepcopy=False)
            logical = logical_trials(trials)
            waiting = any(t.state == TrialState.WAITING for t in trials)
            if len(logical) >= self.settings.budget and not waiting:
                if any(t.state == TrialState.RUNNING for t in trials):
                    self._sleep(self.settings.poll_interval_s)  # another worker's trial: wait for it or its staleness
                    continue
                break
            self._run_trial(study, study.ask(self._distributions), baseline)
        self.table_trials.table_trial(study, baseline)
        self.table_trials.per_size_trials(study, baseline)
        proofs = self._prove(study, baseline)
        outcome = self.outcome(study, proofs)
        self._progress("done", study)
        return outcome

    # ---------------------------------------------------------------- search

    def _run_trial(self, study: optuna.Study, trial: optuna.Trial, baseline: Measurements | None) -> None:
        storage = self._storage
        trial_id = self._trial_id(study, trial.number)
        self._active.add(trial.number)
        try:
            # A sampled trial carries no role/attempt attributes: readers default them (one commit less each).
            trial.set_user_attr(A_WORKER, self.settings.worker_id)
            trial.set_user_attr(A_HEARTBEAT, self._clock())
            is_baseline = role_of(trial.user_attrs) is TrialRole.BASELINE
            if not is_baseline and baseline is None:
                raise StudyError("internal: a trial before the baseline")  # BaselineTrials.ensure orders them
            config = self.config_of(trial.params, trial.user_attrs)
            logger.info(
                "trial %d (%s): %s, order %s",
                trial.number,
                role_of(trial.user_attrs).value,
                config.tuned_env(self.space.site_fixed) or "defaults",
                config.rank_order.name,
            )
            state, value = self._measure(trial, config, baseline, storage=storage, trial_id=trial_id)
            if state == TrialState.COMPLETE:
                study.tell(trial, value)
            else:
                study.tell(trial, state=state)
            self._finished_here += 1
        except optuna.exceptions.UpdateFinishedTrialError:
            # Another worker declared this trial stale while it ran; its retry counts instead.
            logger.warning("trial %d was failed as stale by another worker; its result is dropped", trial.number)
        finally:
            self._active.discard(trial.number)
        self._progress("search", study)

    def _measure(
        self,
        trial: optuna.Trial,
        config: TrialConfig,
        baseline: Measurements | None,
        *,
        storage: Any,
        trial_id: int,
    ) -> tuple[TrialState, float | None]:
        measured: Measurements | None = None
        value = 1.0
        # An option trial forces one entry in every bucket that offers it, by design far slower in some: its
        # value over the whole ladder means nothing, each covered bucket does (so it is never pruned).
        prunable = baseline is not None and role_of(trial.user_attrs) is not TrialRole.OPTION
        with Heartbeat(storage, trial_id, interval=self.settings.heartbeat_interval_s, clock=self._clock):
            for step, sizes in enumerate(self._rungs):
                request = MeasurementRequest(self.objective.collectives, sizes, trial.number, "search")
                try:
                    got = requested(self._evaluate(config, request), request)
                except TrialFailed as failure:
                    logger.warning("trial %d %s: %s", trial.number, failure.kind, failure.reason)
                    trial.set_user_attr(A_FAILURE, failure.kind)
                    trial.set_user_attr(A_REASON, failure.reason)
                    return TrialState.FAIL, None
                measured = got if measured is None else measured.merged(got)
                if baseline is not None:
                    value = self.objective.value(measured, baseline)
                trial.report(value, step)
                best = self._hopeless(trial, step, value) if prunable and step < len(self._rungs) - 1 else None
                if best is not None:
                    reason = (
                        f"pruned after rung {step + 1} of {len(self._rungs)} (sizes up to {max(sizes)} B): partial "
                        f"speedup {value:.3f}x below {self.settings.prune_ratio:g} x the best completed trial's "
                        f"{best:.3f}x there"
                    )
                    logger.info("trial %d %s", trial.number, reason)
                    trial.set_user_attr(A_REASON, reason)
                    trial.set_user_attr(A_MEASUREMENTS, measured.to_json())
                    return TrialState.PRUNED, None
        # Stored once, at the end: a trial killed mid-way is measured again from scratch by its retry.
        if measured is not None:
            trial.set_user_attr(A_MEASUREMENTS, measured.to_json())
            if baseline is not None and self.settings.sampler == "tpe":  # the one sampler here that models them
                trial.set_constraint(C_BUCKET_FLOOR, self._shortfall(measured, baseline))
        return TrialState.COMPLETE, value

    def _shortfall(self, measured: Measurements, baseline: Measurements) -> float:
        """How far the worst weighted bucket fell below ``1 - maxLoss - SEARCH_SLACK`` (<= 0: feasible).

        TPE then models the feasible trials (Optuna's constrained TPE): the search spends its budget where a
        configuration could pass the proof, not only where the weighted speedup is highest; the best trial by
        value is still a finalist (as the trade-off when it is not safe). Feasible is what the finalists'
        "looked safe" means.
        """
        return shortfall(measured, baseline, objective=self.objective, max_loss=self.settings.max_loss)

    def _hopeless(self, trial: optuna.Trial, step: int, value: float) -> float | None:
        """The best completed trial's partial value at ``step`` when this one is hopeless next to it, else None."""
        if self.settings.prune_ratio <= 0:
            return None
        peers = [
            t.intermediate_values[step]
            for t in trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if step in t.intermediate_values
        ]
        if len(peers) < self.settings.prune_startup:
            return None
        best = max(peers)
        return best if value < self.settings.prune_ratio * best else None

    # ---------------------------------------------------------------- proof

    def _prover(self, on_pair: Callable[[int, int], None] = lambda done, total: None) -> Prover:
        st = self.settings
        return Prover(
            ProofSettings(
                # Proof pairs measure only what the workload weighs (a trace's unused sizes cost no pair time).
                sizes=self.objective.weighted_sizes(st.ladder),
                pairs=st.proof_pairs,
                max_pairs=st.proof_pairs_max,
                alpha=st.alpha,
                min_effect=st.min_effect,
                max_loss=st.max_loss,
                small_runs=SMALL_RUNS,
            ),
            objective=self.objective,
            evaluate=self._evaluate,
            baseline_config=self.space.config(self.space.baseline_params()),
            config_of=self.config_of,
            on_pair=on_pair,
        )

    def _prove(self, study: optuna.Study, baseline: Measurements) -> list[FinalistProof]:
        prover = self._prover(lambda done, total: self._progress("proof", study, done=done, total=total))
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        finalists = choose_finalists(
            complete,
            baseline,
            baseline_params=to_optuna(self.space, self.space.baseline_params()),
            objective=self.objective,
            max_loss=self.settings.max_loss,
            count=self.settings.finalists,
        )
        return prover.prove(study, finalists)

    # ---------------------------------------------------------------- reporting

    def outcome(self, study: optuna.Study, proofs: Sequence[FinalistProof]) -> StudyOutcome:
        st = self.settings
        return study_outcome(
            study.get_trials(deepcopy=False),
            proofs,
            self.space,
            name=st.name,
            sampler=st.sampler,
            seed=st.seed,
            max_loss=st.max_loss,
            alpha=st.alpha,
            min_effect=st.min_effect,
        )

    def _progress(
        self,
        phase: Literal["search", "proof", "done"],
        study: optuna.Study,
        *,
        done: int | None = None,
        total: int | None = None,
    ) -> None:
        if self._on_progress is not None:
            trials = study.get_trials(deepcopy=False)
            per_trial = (self._clock() - self._started) / self._finished_here if self._finished_here else None
            progress = study_progress(phase, trials, self.settings.budget, per_trial, done=done, total=total)
            self._on_progress(progress)


def run_study(
    settings: StudySettings,
    *,
    space: SearchSpace,
    objective: Objective,
    evaluate: Evaluator,
    candidates: Sequence[Candidate] = (),
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[StudyProgress], None] | None = None,
) -> StudyOutcome:
    """Run (or resume) a study to its outcome. The one call the controller and ``init`` need."""
    return TunerStudy(
        settings,
        space=space,
        objective=objective,
        evaluate=evaluate,
        candidates=candidates,
        clock=clock,
        sleep=sleep,
        on_progress=on_progress,
    ).run()
