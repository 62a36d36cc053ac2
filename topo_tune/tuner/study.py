"""A tuning study: Optuna ask/tell over the search space, persisted in RDB storage, then the proof.

Purpose: run one study end to end, resumable at any point.

1. The **baseline** (every knob unset, NCCL's natural order) is measured first; its value is 1.0 by
   definition. Only then are the caller's topology-derived **candidates** enqueued, then the sampler (TPE,
   seeded, by default) proposes the rest of the budget.
2. Each trial is measured rung by rung along the size ladder (small sizes first); after each rung the
   partial objective is reported as an intermediate value, and a trial whose partial speedup is hopeless
   next to the best completed trials at that rung is **pruned**, saving its large sizes.
3. A measurement that fails, returns a wrong result or times out raises :class:`TrialFailed`; the trial is
   recorded as failed with the kind and reason in its user attributes, and never chosen.
4. **Our own heartbeats**: every running trial carries the time of its last heartbeat and its worker's id.
   Optuna's (``heartbeat_interval``, ``fail_stale_trials``, ``RetryFailedTrialCallback``) are beaten only
   inside ``study.optimize``, judge staleness by the database's wall clock (not the injected one a resume
   test drives) and cannot tell a restarted worker's own trials, so they do not fit ask/tell here. A running
   trial whose worker is this one (a restarted controller reusing its id) but that this process is not
   running, or whose heartbeat is older than ``stale_after_s``, is
   failed as ``stale`` and enqueued again once. A study killed at any point and run again with the same
   settings finishes with every trial counted once: waiting trials are picked up, stale ones retried once,
   and the enqueueing steps are idempotent.
5. The **proof** (``proof``): the best finalists are re-measured interleaved with the baseline; a finalist is
   chosen only when every weighted (collective, bucket) is shown safe and one is shown faster.

The measurement is injected (:class:`Evaluator`), as are the clock and the sleep used while waiting for
another worker's trial, so the controller plugs in real benchmark jobs and tests a model.

Non-goals: dispatching benchmark jobs, writing output files (``outputs``), keying results by cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from topo_tune.cluster_config import SamplerName, SearchConfig
from topo_tune.config_checks import naming_fields
from topo_tune.errors import ConfigError, FailureKind, StudyError, TrialFailed
from topo_tune.tuner import size_options, statistics
from topo_tune.tuner.coordinate_descent import CoordinateDescentSampler
from topo_tune.tuner.evaluation import Evaluator, MeasurementRequest, requested
from topo_tune.tuner.objective import DEFAULT_LADDER, Measurements, Objective
from topo_tune.tuner.plugin_table import ScoredTrial, compose_table
from topo_tune.tuner.proof import BucketProof, FinalistProof, ProofSettings, Prover, Tradeoff, tradeoff
from topo_tune.tuner.space import RankOrder, SearchSpace, TrialConfig

__all__ = [
    "SAMPLERS",
    "BucketProof",
    "Candidate",
    "Evaluator",
    "FailureKind",
    "FinalistProof",
    "MeasurementRequest",
    "SamplerName",
    "StudyError",
    "StudyOutcome",
    "StudyProgress",
    "StudySettings",
    "Tradeoff",
    "TrialFailed",
    "TrialRecord",
    "TunerStudy",
    "run_study",
    "stored_rank_orders",
]

logger = logging.getLogger(__name__)

SAMPLERS: tuple[SamplerName, ...] = get_args(SamplerName)
_SEARCH = SearchConfig()
"""cluster.yaml's ``search`` defaults: the study's, written once there."""
_FROM_SEARCH = (
    "budget",
    "sampler",
    "seed",
    "rungs",
    "finalists",
    "proof_pairs",
    "proof_pairs_max",
    "min_effect",
    "max_loss",
)
_MAX_ATTEMPTS = 2  # a stale trial is retried once
_UNLABELED_GRACE_S = 10.0
"""How long a running trial without a worker label is left alone (labelling takes milliseconds)."""

# Trial user attributes (the persisted record of each trial besides Optuna's own columns).
A_ROLE = "role"  # baseline | candidate | sampled | table
A_TABLE = "tuner_table"  # the candidate tuner-plugin table a "table" trial runs with
A_CANDIDATE = "candidate"
A_ATTEMPT = "attempt"
A_RETRY_OF = "retry_of"
A_WORKER = "worker"
A_HEARTBEAT = "heartbeat"
A_FAILURE = "failure_kind"  # failed | wrong_result | timeout | stale
A_REASON = "failure_reason"
A_MEASUREMENTS = "measurements"
S_FINGERPRINT = "space_fingerprint"
S_RANK_ORDERS = "rank_orders"  # the space's orders as the study started: a resume searches these again
S_MEASURED = "measured"  # the sizes and workload the stored values and proof pairs were measured for


@dataclass(frozen=True)
class Candidate:
    """A configuration to try early, e.g. the ring-order optimizer's order with NCCL's defaults."""

    name: str
    params: Mapping[str, str]


@dataclass(frozen=True)
class StudySettings:
    """How a study runs. ``worker_id`` must be unique among live processes; a restart may reuse it."""

    name: str
    storage: str  # SQLAlchemy URL: sqlite:///… embedded, postgresql+psycopg://… in production
    budget: int = _SEARCH.budget
    sampler: SamplerName = _SEARCH.sampler
    seed: int = _SEARCH.seed
    ladder: tuple[int, ...] = DEFAULT_LADDER
    rungs: int = _SEARCH.rungs
    prune_ratio: float = 0.8  # prune below this fraction of the best completed value at a rung; 0: never
    prune_startup: int = 5  # completed trials needed before pruning starts
    # TPE models the landscape from the third finished trial on (the baseline and the candidates count), and
    # picks each proposal from 64 draws of its model. Optuna's defaults (10 random start-up trials, 24 draws)
    # suit a study that knows nothing; here the baseline and the topology-derived candidates are measured
    # first, and 10 random trials would spend a quarter of a 40-trial budget ignoring them
    # (benchmarks/search_efficiency.py measures both).
    tpe_startup: int = 3
    tpe_ei_candidates: int = 64
    finalists: int = _SEARCH.finalists
    proof_pairs: int = _SEARCH.proof_pairs
    proof_pairs_max: int = _SEARCH.proof_pairs_max
    """Pairs a finalist may get in all (looks of ``proof_pairs``) while a weighted bucket is undecided."""
    alpha: float = statistics.DEFAULT_ALPHA
    min_effect: float = _SEARCH.min_effect
    max_loss: float = _SEARCH.max_loss
    """The largest loss a shipped configuration may have in any weighted bucket (at its lower bound)."""
    worker_id: str = "topo-tune"
    table_shape: tuple[int, int] | None = None
    """(nNodes, nRanks) of the job's communicator: after the search, compose a tuner-plugin table from the
    per-bucket winners and measure it as one more trial (``plugin_table``); None: no table trial."""
    heartbeat_interval_s: float = 10.0
    stale_after_s: float = 60.0
    poll_interval_s: float = 1.0

    def __post_init__(self) -> None:
        with naming_fields(where="study", error=ConfigError):  # the settings cluster.yaml's search has: its checks
            SearchConfig.model_validate({name: getattr(self, name) for name in _FROM_SEARCH})
        checks: list[tuple[str, bool, str]] = [
            ("name", bool(self.name), "must not be empty"),
            ("storage", "://" in self.storage, f"expected a SQLAlchemy URL, got {self.storage!r}"),
            ("tpe_startup", self.tpe_startup >= 0, f"must be >= 0, got {self.tpe_startup}"),
            ("tpe_ei_candidates", self.tpe_ei_candidates >= 1, f"must be at least 1, got {self.tpe_ei_candidates}"),
            ("prune_ratio", 0 <= self.prune_ratio < 1, f"must be within [0, 1), got {self.prune_ratio}"),
            (
                "proof_pairs_max",
                self.proof_pairs_max >= self.proof_pairs,
                f"must be at least proof_pairs ({self.proof_pairs}), got {self.proof_pairs_max}",
            ),
            ("heartbeat_interval_s", self.heartbeat_interval_s > 0, "must be > 0"),
            (
                "stale_after_s",
                self.stale_after_s > self.heartbeat_interval_s,
                "must be longer than heartbeat_interval_s",
            ),
        ]
        for name, ok, reason in checks:
            if not ok:
                raise ConfigError(f"study.{name}", reason)


@dataclass(frozen=True)
class TrialRecord:
    """One trial as stored: what it ran and what came of it."""

    number: int
    state: str  # complete | pruned | failed | wrong_result | timeout | stale | running | waiting
    role: str
    params: Mapping[str, str]
    env: Mapping[str, str]
    rank_order: str
    value: float | None
    reason: str | None
    intermediate: tuple[tuple[int, float], ...]
    measurements: Measurements | None
    attempt: int
    superseded: bool  # a stale trial whose retry is another record
    tuner_table: str = ""  # the candidate table a "table" trial ran with


@dataclass(frozen=True)
class StudyOutcome:
    """Everything a study found; ``chosen`` is None when the answer is "keep NCCL's defaults"."""

    name: str
    sampler: str
    seed: int
    space_fingerprint: str
    baseline: TrialRecord
    best: TrialRecord | None
    trials: tuple[TrialRecord, ...]
    proofs: tuple[FinalistProof, ...]
    chosen: FinalistProof | None
    simulated: bool
    natural_order: RankOrder
    site_fixed: Mapping[str, str] = field(default_factory=dict)
    tradeoff: Tradeoff | None = None
    """The best finalist measured faster overall that could not be chosen (never the result)."""
    max_loss: float = statistics.DEFAULT_MAX_LOSS
    alpha: float = statistics.DEFAULT_ALPHA
    min_effect: float = statistics.DEFAULT_MIN_EFFECT


@dataclass(frozen=True)
class StudyProgress:
    phase: Literal["search", "proof", "done"]
    done: int
    total: int
    best_value: float | None
    eta_s: float | None


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Optuna distributions of the space: ordered dimensions as value indices, the rest categorical."""
    out: dict[str, BaseDistribution] = {}
    for name in space.names:
        values = space.values_of(name)
        if space.is_ordered(name):
            out[name] = IntDistribution(0, len(values) - 1)
        else:
            out[name] = CategoricalDistribution(list(values))
    return out


def to_optuna(space: SearchSpace, params: Mapping[str, str]) -> dict[str, Any]:
    return {n: space.values_of(n).index(params[n]) if space.is_ordered(n) else params[n] for n in space.names}


def _has_every_param(space: SearchSpace, params: Mapping[str, Any]) -> bool:
    return all(n in params for n in space.names)


def from_optuna(space: SearchSpace, params: Mapping[str, Any]) -> dict[str, str]:
    """Optuna's params as the space's values (those present: a trial killed inside ``ask()`` holds a subset)."""
    return {
        n: space.values_of(n)[int(params[n])] if space.is_ordered(n) else str(params[n])
        for n in space.names
        if n in params
    }


def make_sampler(settings: StudySettings, space: SearchSpace) -> optuna.samplers.BaseSampler:
    if settings.sampler == "tpe":
        return optuna.samplers.TPESampler(
            seed=settings.seed,
            n_startup_trials=settings.tpe_startup,
            n_ei_candidates=settings.tpe_ei_candidates,
            multivariate=True,
            group=False,
        )
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    if settings.sampler == "cmaes":
        # CMA-ES models the ordered (integer) dimensions; categorical ones fall back to random sampling.
        return optuna.samplers.CmaEsSampler(
            seed=settings.seed, n_startup_trials=settings.tpe_startup, warn_independent_sampling=False
        )
    return CoordinateDescentSampler(distributions(space), seed=settings.seed)


class _Heartbeat:
    """Writes the trial's heartbeat every ``interval`` seconds from a thread until stopped."""

    def __init__(self, storage: Any, trial_id: int, *, interval: float, clock: Callable[[], float]) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{trial_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.set_trial_user_attr(self._trial_id, A_HEARTBEAT, self._clock())
            except Exception:  # a lost heartbeat only makes the trial look stale sooner; never kill the trial
                logger.warning("heartbeat of trial id %s not written", self._trial_id, exc_info=True)


class TunerStudy:
    """One study over ``space``, scored by ``objective``, measured by ``evaluate``."""

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
        self._candidates = list(candidates)
        self._clock = clock
        self._sleep = sleep
        self._on_progress = on_progress
        self._distributions = distributions(space)
        self._rungs = objective.rungs(settings.ladder, settings.rungs)
        self._active: set[int] = set()
        self._storages: list[optuna.storages.RDBStorage] = []
        self._storage: optuna.storages.RDBStorage  # the one open() opened last
        self._started = clock()
        self._finished_here = 0
        names = [c.name for c in self._candidates]
        if len(set(names)) != len(names):
            raise ConfigError("candidates", f"names must be unique, got {names}")
        for c in self._candidates:
            space.config(c.params)  # refuses values outside the space, naming the dimension

    # ---------------------------------------------------------------- study lifecycle

    def open(self) -> optuna.Study:
        """Create the study, or load it when it exists (then it must have been made for the same space)."""
        storage = optuna.storages.RDBStorage(self.settings.storage, engine_kwargs=_engine_kwargs(self.settings.storage))
        self._storages.append(storage)
        self._storage = storage
        study = optuna.create_study(
            study_name=self.settings.name,
            storage=storage,
            sampler=make_sampler(self.settings, self.space),
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
        measured = self._measured()
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
        """The storage's id of trial ``number`` (through the storage's public API, not Optuna's private fields)."""
        study_id = self._storage.get_study_id_from_name(study.study_name)
        return self._storage.get_trial_id_from_study_id_trial_number(study_id, number)

    def _measured(self) -> str:
        profile = self.objective.profile
        return json.dumps(
            {
                "sizes": sorted(set(self.settings.ladder)),
                "collectives": {c: float(profile.collectives[c]) for c in self.objective.collectives},
                "buckets": {b: float(w) for b, w in sorted(profile.buckets.items())},
            },
            separators=(",", ":"),
        )

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
        baseline = self._ensure_baseline(study)
        self._enqueue_candidates(study)
        while True:
            self._reclaim_stale(study)
            trials = study.get_trials(deepcopy=False)
            logical = _logical(trials)
            waiting = any(t.state == TrialState.WAITING for t in trials)
            if len(logical) >= self.settings.budget and not waiting:
                if any(t.state == TrialState.RUNNING for t in trials):
                    self._sleep(self.settings.poll_interval_s)  # another worker's trial: wait for it or its staleness
                    continue
                break
            self._run_trial(study, study.ask(self._distributions), baseline)
        self._table_trial(study, baseline)
        self._per_size_trials(study, baseline)
        proofs = self._prove(study, baseline)
        outcome = self.outcome(study, proofs)
        self._progress("done", study)
        return outcome

    # ---------------------------------------------------------------- search

    def _ensure_baseline(self, study: optuna.Study) -> Measurements:
        while True:
            trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(A_ROLE) == "baseline"]
            for t in trials:
                if t.state == TrialState.COMPLETE:
                    return Measurements.from_json(t.user_attrs[A_MEASUREMENTS])
            if not trials:
                study.enqueue_trial(
                    to_optuna(self.space, self.space.baseline_params()), user_attrs={A_ROLE: "baseline", A_ATTEMPT: 1}
                )
                continue
            if any(t.state == TrialState.WAITING for t in trials):
                self._run_trial(study, study.ask(self._distributions), None)
                continue
            if any(t.state == TrialState.RUNNING for t in trials):
                self._sleep(self.settings.poll_interval_s)
                self._reclaim_stale(study)
                continue
            last = max(trials, key=lambda t: t.number)
            if last.user_attrs.get(A_FAILURE) == "stale":
                # Its worker died, the measurement did not fail: nothing runs without the baseline, so unlike a
                # trial of the search (retried once) it is measured again as often as the study is resumed.
                attempt = int(last.user_attrs.get(A_ATTEMPT, 1)) + 1
                study.enqueue_trial(
                    to_optuna(self.space, self.space.baseline_params()),
                    user_attrs={A_ROLE: "baseline", A_ATTEMPT: attempt, A_RETRY_OF: last.number},
                )
                continue
            raise StudyError(
                f"the baseline (NCCL's defaults) could not be measured: "
                f"{last.user_attrs.get(A_FAILURE, 'failed')}: {last.user_attrs.get(A_REASON, 'no reason recorded')}"
            )

    def _enqueue_candidates(self, study: optuna.Study) -> None:
        room = max(self.settings.budget - 1, 0)
        if len(self._candidates) > room:
            logger.warning(
                "study %s: %d candidates, budget leaves room for %d", self.settings.name, len(self._candidates), room
            )
        existing = {t.user_attrs.get(A_CANDIDATE) for t in study.get_trials(deepcopy=False)}
        for candidate in self._candidates[:room]:
            if candidate.name in existing:
                continue
            study.enqueue_trial(
                to_optuna(self.space, candidate.params),
                user_attrs={A_ROLE: "candidate", A_CANDIDATE: candidate.name, A_ATTEMPT: 1},
            )

    def _run_trial(self, study: optuna.Study, trial: optuna.Trial, baseline: Measurements | None) -> None:
        storage = self._storage
        trial_id = self._trial_id(study, trial.number)
        self._active.add(trial.number)
        try:
            # A sampled trial carries no role/attempt attributes: readers default them (one commit less each).
            trial.set_user_attr(A_WORKER, self.settings.worker_id)
            trial.set_user_attr(A_HEARTBEAT, self._clock())
            is_baseline = trial.user_attrs.get(A_ROLE) == "baseline"
            if not is_baseline and baseline is None:
                raise StudyError("internal: a trial before the baseline")  # _ensure_baseline orders them
            config = self._config_of(trial.params, trial.user_attrs)
            logger.info(
                "trial %d (%s): %s, order %s",
                trial.number,
                trial.user_attrs.get(A_ROLE),
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
        with _Heartbeat(storage, trial_id, interval=self.settings.heartbeat_interval_s, clock=self._clock):
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
                if baseline is not None and step < len(self._rungs) - 1 and self._hopeless(trial, step, value):
                    logger.info("trial %d pruned at rung %d (partial speedup %.3f)", trial.number, step, value)
                    trial.set_user_attr(A_MEASUREMENTS, measured.to_json())
                    return TrialState.PRUNED, None
        # Stored once, at the end: a trial killed mid-way is measured again from scratch by its retry.
        if measured is not None:
            trial.set_user_attr(A_MEASUREMENTS, measured.to_json())
        return TrialState.COMPLETE, value

    def _hopeless(self, trial: optuna.Trial, step: int, value: float) -> bool:
        if self.settings.prune_ratio <= 0:
            return False
        peers = [
            t.intermediate_values[step]
            for t in trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if step in t.intermediate_values
        ]
        if len(peers) < self.settings.prune_startup:
            return False
        return value < self.settings.prune_ratio * max(peers)

    def _reclaim_stale(self, study: optuna.Study) -> None:
        """Fail running trials whose worker is gone, and enqueue each once more (idempotently)."""
        now = self._clock()
        trials = study.get_trials(deepcopy=False)
        retried = {t.user_attrs.get(A_RETRY_OF) for t in trials}
        storage = self._storage
        for t in trials:
            if t.state != TrialState.RUNNING or t.number in self._active:
                continue
            beat = t.user_attrs.get(A_HEARTBEAT)
            if beat is None:
                beat = t.datetime_start.timestamp() if t.datetime_start is not None else now
            mine = t.user_attrs.get(A_WORKER) == self.settings.worker_id
            # A worker labels its trial right after asking for it; one killed in between leaves a running trial
            # nobody owns, which no heartbeat will ever refresh: reclaim it after a short grace, not stale_after_s.
            unlabeled = A_WORKER not in t.user_attrs
            patience = _UNLABELED_GRACE_S if unlabeled else self.settings.stale_after_s
            if not mine and now - float(beat) <= patience:
                continue
            if mine:
                reason = "its worker restarted while it ran"
            elif unlabeled:
                reason = f"its worker stopped before labelling it ({now - float(beat):.0f} s ago)"
            else:
                reason = f"no heartbeat for {now - float(beat):.0f} s (worker {t.user_attrs.get(A_WORKER, 'unknown')})"
            logger.warning("trial %d is stale: %s", t.number, reason)
            trial_id = self._trial_id(study, t.number)
            storage.set_trial_user_attr(trial_id, A_FAILURE, "stale")
            storage.set_trial_user_attr(trial_id, A_REASON, reason)
            attempt = int(t.user_attrs.get(A_ATTEMPT, 1))
            if attempt < _MAX_ATTEMPTS and t.number not in retried:
                attrs = {k: v for k, v in t.user_attrs.items() if k in (A_ROLE, A_CANDIDATE, A_TABLE)}
                attrs.update({A_ATTEMPT: attempt + 1, A_RETRY_OF: t.number})
                study.enqueue_trial(self._retry_params(t), user_attrs=attrs)
            # If it finished meanwhile its result stands; the retry, if any, just measures it again.
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                storage.set_trial_state_values(trial_id, TrialState.FAIL)

    def _retry_params(self, t: FrozenTrial) -> dict[str, Any]:
        """What a stale trial's retry measures: its own params, once every one of them was stored.

        Optuna stores a trial's params one by one as ``ask()`` suggests them, so a worker killed inside ``ask()``
        leaves a subset. An enqueued trial (baseline, candidate, table) is then retried with the params it was
        enqueued with; a sampled one with none fixed, so the sampler draws a whole new configuration.
        """
        if _has_every_param(self.space, t.params):
            return dict(t.params)
        fixed = t.system_attrs.get("fixed_params")
        return dict(fixed) if isinstance(fixed, dict) else {}

    # ---------------------------------------------------------------- tuner table

    def _config_of(self, params: Mapping[str, Any], attrs: Mapping[str, Any]) -> TrialConfig:
        """A trial's configuration: its params, plus the candidate table a "table" trial carries."""
        config = self.space.config(from_optuna(self.space, params))
        table = attrs.get(A_TABLE)
        return dataclasses.replace(config, tuner_table=str(table)) if table else config

    def _table_trial(self, study: optuna.Study, baseline: Measurements) -> None:
        """Compose a table from the search's per-bucket winners and measure it, once per study."""
        if self.settings.table_shape is None:
            return
        while True:
            trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(A_ROLE) == "table"]
            if any(t.state == TrialState.WAITING for t in trials):
                self._run_trial(study, study.ask(self._distributions), baseline)
                continue
            if trials:
                return  # measured (or failed, or left to another worker's retry): the proof takes it from here
            searched = [
                ScoredTrial(t.number, self._config_of(t.params, t.user_attrs).env, t.value, Measurements.from_json(raw))
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.user_attrs.get(A_ROLE) != "baseline"
                and t.value is not None
                and (raw := t.user_attrs.get(A_MEASUREMENTS))
            ]
            nodes, ranks = self.settings.table_shape
            composed = compose_table(searched, baseline, self.objective, nodes=nodes, ranks=ranks)
            if composed is None:
                logger.info(
                    "study %s: no size bucket asks for its own channel count; no table trial", self.settings.name
                )
                return
            base = self._config_of(study.trials[composed.base_trial].params, {})
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
                to_optuna(self.space, params), user_attrs={A_ROLE: "table", A_TABLE: composed.text, A_ATTEMPT: 1}
            )

    # ---------------------------------------------------------------- per-size search (size_options)

    def _per_size_trials(self, study: optuna.Study, baseline: Measurements) -> None:
        """Measure NCCL's per-bucket options for the best bases, then each base's composed table, once."""
        if self.settings.table_shape is None:
            return
        nodes, ranks = self.settings.table_shape
        while True:
            trials = study.get_trials(deepcopy=False)
            if any(t.state == TrialState.WAITING and t.user_attrs.get(A_ROLE) in size_options.ROLES for t in trials):
                self._run_trial(study, study.ask(self._distributions), baseline)
                continue
            stored = [self._stored(t) for t in _logical(trials) if _has_every_param(self.space, t.params)]
            planned, pending = size_options.plan_next(stored, baseline, self.objective, nodes=nodes, ranks=ranks)
            for trial in planned:
                logger.info("study %s: per-size %s (base trial %d)", self.settings.name, trial.key, trial.base)
                attrs = {A_ROLE: trial.role, A_CANDIDATE: trial.key, A_TABLE: trial.table, A_ATTEMPT: 1}
                study.enqueue_trial(dict(trial.params), user_attrs=attrs)
            if planned:
                continue
            if not pending:
                return
            self._sleep(self.settings.poll_interval_s)  # another worker's option trial: wait for it or its staleness
            self._reclaim_stale(study)

    def _stored(self, t: FrozenTrial) -> size_options.StoredTrial:
        raw = t.user_attrs.get(A_MEASUREMENTS)
        config = self._config_of(t.params, {})
        return size_options.StoredTrial(
            number=t.number,
            role=str(t.user_attrs.get(A_ROLE, "sampled")),
            key=str(t.user_attrs.get(A_CANDIDATE, "")),
            finished=t.state.is_finished(),
            value=t.value if t.state == TrialState.COMPLETE else None,
            env=config.env,
            rank_order=config.rank_order.name,
            params=t.params,
            measurements=Measurements.from_json(raw) if raw and t.state == TrialState.COMPLETE else None,
            table=str(t.user_attrs.get(A_TABLE, "")),
        )

    # ---------------------------------------------------------------- proof

    def _finalists(self, study: optuna.Study, baseline: Measurements) -> list[FrozenTrial]:
        """The best trial by search value, then the table trials, then the best that looked safe, then by value.

        The best value may trade a loss in some bucket for a gain elsewhere: proven, it is named as the
        trade-off. A composed table and the best trial whose search measurement was within ``max_loss`` in every
        weighted bucket are the ones the proof can most likely ship, so they are proven next.
        """
        seen: set[tuple[tuple[str, Any], ...]] = set()  # params and table: a table trial is its own finalist
        baseline_key = tuple(sorted(to_optuna(self.space, self.space.baseline_params()).items()))
        ranked = []
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        for t in sorted(complete, key=lambda t: (-(t.value or 0.0), t.number)):
            key = (*sorted(t.params.items()), (A_TABLE, t.user_attrs.get(A_TABLE, "")))
            if t.user_attrs.get(A_ROLE) == "baseline" or key == (*baseline_key, (A_TABLE, "")) or key in seen:
                continue
            if t.value is None or t.value <= 1.0:
                break
            seen.add(key)
            ranked.append(t)
        # After the best: the composed tables (built from per-bucket winners, the likeliest to be safe everywhere),
        # then the best that looked safe, then the rest by value.
        tables = [t for t in ranked if t.user_attrs.get(A_ROLE) in ("table", size_options.ROLE_COMPOSED)]
        safe = [t for t in ranked if self._looked_safe(t, baseline)][:1]
        out: list[FrozenTrial] = []
        for t in [*ranked[:1], *tables, *safe, *ranked]:
            if t not in out:
                out.append(t)
        return out[: self.settings.finalists]

    def _looked_safe(self, trial: FrozenTrial, baseline: Measurements) -> bool:
        raw = trial.user_attrs.get(A_MEASUREMENTS)
        if not raw:
            return False
        scores = self.objective.bucket_scores(Measurements.from_json(raw), baseline)
        weighted = [s for s in scores if self.objective.profile.weight(s.collective, s.bucket.name) > 0]
        return bool(weighted) and all(s.speedup >= 1 - self.settings.max_loss for s in weighted)

    def _prover(self, on_pair: Callable[[int, int], None] = lambda done, total: None) -> Prover:
        st = self.settings
        return Prover(
            ProofSettings(
                sizes=tuple(sorted(set(st.ladder))),
                pairs=st.proof_pairs,
                max_pairs=st.proof_pairs_max,
                alpha=st.alpha,
                min_effect=st.min_effect,
                max_loss=st.max_loss,
            ),
            objective=self.objective,
            evaluate=self._evaluate,
            baseline_config=self.space.config(self.space.baseline_params()),
            config_of=self._config_of,
            on_pair=on_pair,
        )

    def _prove(self, study: optuna.Study, baseline: Measurements) -> list[FinalistProof]:
        prover = self._prover(lambda done, total: self._progress("proof", study, done=done, total=total))
        return prover.prove(study, self._finalists(study, baseline))

    # ---------------------------------------------------------------- reporting

    def outcome(self, study: optuna.Study, proofs: Sequence[FinalistProof]) -> StudyOutcome:
        trials = study.get_trials(deepcopy=False)
        superseded = _superseded(trials)
        records = tuple(self._record(t, t.number in superseded) for t in trials)
        baseline = next(r for r in records if r.role == "baseline" and r.state == "complete")
        searched = [r for r in records if r.state == "complete" and r.role != "baseline" and r.value is not None]
        best = max(searched, key=lambda r: (r.value or 0.0, -r.number), default=None)
        promoted = [p for p in proofs if p.promoted]
        chosen = max(promoted, key=lambda p: (p.speedup, -p.trial), default=None)
        alternative = tradeoff(proofs, chosen)
        simulated = any(r.measurements is not None and r.measurements.simulated for r in records)
        return StudyOutcome(
            name=self.settings.name,
            sampler=self.settings.sampler,
            seed=self.settings.seed,
            space_fingerprint=self.space.fingerprint(),
            baseline=baseline,
            best=best,
            trials=records,
            proofs=tuple(proofs),
            chosen=chosen,
            simulated=simulated,
            natural_order=self.space.rank_orders[0],
            site_fixed=dict(self.space.site_fixed),
            tradeoff=alternative,
            max_loss=self.settings.max_loss,
            alpha=self.settings.alpha,
            min_effect=self.settings.min_effect,
        )

    def _record(self, t: FrozenTrial, superseded: bool) -> TrialRecord:
        # A trial killed inside ask() holds only some params: shown as they are, with no configuration.
        complete = _has_every_param(self.space, t.params)
        params = from_optuna(self.space, t.params)
        config = self._config_of(t.params, t.user_attrs) if complete else None
        state = {
            TrialState.COMPLETE: "complete",
            TrialState.PRUNED: "pruned",
            TrialState.RUNNING: "running",
            TrialState.WAITING: "waiting",
        }.get(t.state, str(t.user_attrs.get(A_FAILURE, "failed")))
        raw = t.user_attrs.get(A_MEASUREMENTS)
        return TrialRecord(
            number=t.number,
            state=state,
            role=str(t.user_attrs.get(A_ROLE, "sampled")),
            params=params,
            env=dict(config.env) if config else {},
            rank_order=config.rank_order.name if config else "",
            value=t.value if t.state == TrialState.COMPLETE else None,
            reason=t.user_attrs.get(A_REASON),
            intermediate=tuple(sorted(t.intermediate_values.items())),
            measurements=Measurements.from_json(raw) if raw else None,
            attempt=int(t.user_attrs.get(A_ATTEMPT, 1)),
            superseded=superseded,
            tuner_table=str(t.user_attrs.get(A_TABLE, "")),
        )

    def _progress(
        self,
        phase: Literal["search", "proof", "done"],
        study: optuna.Study,
        *,
        done: int | None = None,
        total: int | None = None,
    ) -> None:
        if self._on_progress is None:
            return
        trials = study.get_trials(deepcopy=False)
        finished = [t for t in _logical(trials) if t.state.is_finished()]
        values = [t.value for t in finished if t.state == TrialState.COMPLETE and t.value is not None]
        if done is None:
            # The table trial comes after the budget's searched trials: it adds itself to the total once asked for.
            tables = sum(1 for t in _logical(trials) if t.user_attrs.get(A_ROLE) in ("table", *size_options.ROLES))
            done, total = len(finished), self.settings.budget + tables
        assert total is not None
        elapsed = self._clock() - self._started
        rate = elapsed / self._finished_here if self._finished_here else None
        eta = rate * max(total - done, 0) if rate is not None and phase == "search" else None
        self._on_progress(StudyProgress(phase, done, total, max(values) if values else None, eta))


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


def stored_rank_orders(storage: str, name: str) -> tuple[RankOrder, ...] | None:
    """The rank orders the study ``name`` started with; None when there is no such study (or it predates this).

    A resumed study must search the space it started with, and its orders come from measured node pairs: a
    caller that plans them again from a new measurement (noise moves near-ties) takes these instead.
    """
    rdb = optuna.storages.RDBStorage(storage, engine_kwargs=_engine_kwargs(storage))
    try:
        try:
            study_id = rdb.get_study_id_from_name(name)
        except KeyError:
            return None
        raw = rdb.get_study_user_attrs(study_id).get(S_RANK_ORDERS)
    finally:
        rdb.engine.dispose()
    return None if raw is None else tuple(RankOrder(n, tuple(nodes)) for n, nodes in json.loads(raw))


def _engine_kwargs(url: str) -> dict[str, Any]:
    """For embedded SQLite: WAL and synchronous=NORMAL on every connection.

    Optuna commits every attribute separately; with SQLite's default rollback journal each commit is a few
    fsyncs. WAL with NORMAL survives a crash of the process (what resuming needs) and only risks the last
    commits on power loss (sqlite.org/wal.html). PostgreSQL URLs are left to SQLAlchemy's defaults.
    """
    parsed = sqlalchemy.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return {}
    path = parsed.database

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, timeout=30.0, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    return {"creator": connect}


def _superseded(trials: Sequence[FrozenTrial]) -> set[int]:
    retried = {t.user_attrs.get(A_RETRY_OF) for t in trials if A_RETRY_OF in t.user_attrs}
    return {t.number for t in trials if t.number in retried and t.state == TrialState.FAIL}


def _logical(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Trials counted against the budget: a stale trial that was retried counts through its retry."""
    gone = _superseded(trials)
    return [t for t in trials if t.number not in gone]
