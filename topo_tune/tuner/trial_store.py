"""How a study's trials live in Optuna's RDB storage: the attributes each carries, its params, heartbeats.

Purpose: the one place that names what a trial stores besides Optuna's own columns (role, table, worker,
heartbeat, measurements, failure), converts the space's values to Optuna's params and back, opens the
storage (SQLite in WAL mode), beats a running trial's heartbeat, and tells which trials count against the
budget (a stale trial that was retried counts through its retry).

Non-goals: running trials and deciding what is stale (``study``, ``stale_trials``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from topo_tune.tuner.objective import Measurements, Objective
from topo_tune.tuner.space import RankOrder, SearchSpace, TrialConfig

__all__ = [
    "A_ATTEMPT",
    "A_CANDIDATE",
    "A_FAILURE",
    "A_HEARTBEAT",
    "A_MEASUREMENTS",
    "A_REASON",
    "A_RETRY_OF",
    "A_ROLE",
    "A_TABLE",
    "A_WORKER",
    "C_BUCKET_FLOOR",
    "S_FINGERPRINT",
    "S_MEASURED",
    "S_RANK_ORDERS",
    "Heartbeat",
    "TrialRole",
    "TrialRunner",
    "distributions",
    "engine_kwargs",
    "from_optuna",
    "has_every_param",
    "logical_trials",
    "measured_key",
    "role_of",
    "stored_rank_orders",
    "superseded_trials",
    "to_optuna",
    "trial_config",
    "trial_id",
]

logger = logging.getLogger(__name__)


class TrialRole(enum.StrEnum):
    """Why a trial exists: the one definition of the roles stored under ``A_ROLE`` and shown in outputs."""

    BASELINE = "baseline"
    """NCCL's defaults in NCCL's natural order: measured first, what every trial is compared with."""
    CANDIDATE = "candidate"
    """A configuration derived from the topology (a ring-order candidate), enqueued before sampling."""
    SAMPLED = "sampled"
    """A configuration the sampler chose."""
    TABLE = "table"
    """A tuner-plugin table composed from the per-bucket winners of the environment trials."""
    OPTION = "option"
    """One per-size option (an algorithm/protocol/channel row) measured on a base configuration."""
    PER_SIZE = "per_size"
    """The table the per-size search composed from its options, measured as one trial."""

    @property
    def has_table(self) -> bool:
        """The trial runs with a tuner-plugin table."""
        return self in (TrialRole.TABLE, TrialRole.OPTION, TrialRole.PER_SIZE)


class TrialRunner(Protocol):
    """What the study's pieces (baseline, stale-trial reclaim, table trials) need of the study that holds them."""

    def run_next(self, study: optuna.Study, baseline: Measurements | None) -> None:
        """Ask for the next trial (an enqueued one first) and run it to its end in this process."""

    def wait_for_others(self, study: optuna.Study) -> None:
        """Another worker's trial is running: wait a poll interval, then reclaim trials whose worker is gone."""

    def config_of(self, params: Mapping[str, Any], attrs: Mapping[str, Any]) -> TrialConfig:
        """The configuration a trial's params and attributes run."""


def trial_id(storage: optuna.storages.RDBStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of trial ``number`` (through the storage's public API, not Optuna's private fields)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def role_of(user_attrs: Mapping[str, object]) -> TrialRole:
    """A stored trial's role (sampled trials store none)."""
    return TrialRole(str(user_attrs.get(A_ROLE, TrialRole.SAMPLED)))


# Trial user attributes (the persisted record of each trial besides Optuna's own columns).
A_ROLE = "role"  # a TrialRole; a sampled trial stores none (readers default it)
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
C_BUCKET_FLOOR = "bucket_floor"  # the trial's constraint (Optuna's): its worst weighted bucket's shortfall


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


def trial_config(space: SearchSpace, params: Mapping[str, Any], attrs: Mapping[str, Any]) -> TrialConfig:
    """A trial's configuration: its params, plus the candidate table a table trial carries."""
    config = space.config(from_optuna(space, params))
    table = attrs.get(A_TABLE)
    return dataclasses.replace(config, tuner_table=str(table)) if table else config


def measured_key(ladder: Sequence[int], objective: Objective) -> str:
    """What a study's stored values and proof pairs were measured for (sizes and workload), as stored."""
    profile = objective.profile
    return json.dumps(
        {
            "sizes": sorted(set(ladder)),
            "collectives": {c: float(profile.collectives[c]) for c in objective.collectives},
            "buckets": {b: float(w) for b, w in sorted(profile.buckets.items())},
            # Only when set, so that the key of every study stored before per-bucket weights stays the same.
            **(
                {"weights": {c: {b: float(w) for b, w in sorted(r.items())} for c, r in sorted(profile.matrix.items())}}
                if profile.matrix is not None
                else {}
            ),
        },
        separators=(",", ":"),
    )


def has_every_param(space: SearchSpace, params: Mapping[str, Any]) -> bool:
    return all(n in params for n in space.names)


def from_optuna(space: SearchSpace, params: Mapping[str, Any]) -> dict[str, str]:
    """Optuna's params as the space's values (those present: a trial killed inside ``ask()`` holds a subset)."""
    return {
        n: space.values_of(n)[int(params[n])] if space.is_ordered(n) else str(params[n])
        for n in space.names
        if n in params
    }


class Heartbeat:
    """Writes the trial's heartbeat every ``interval`` seconds from a thread until stopped."""

    def __init__(self, storage: Any, trial_id: int, *, interval: float, clock: Callable[[], float]) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{trial_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
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


def stored_rank_orders(storage: str, name: str) -> tuple[RankOrder, ...] | None:
    """The rank orders the study ``name`` started with; None when there is no such study (or it predates this).

    A resumed study must search the space it started with, and its orders come from measured node pairs: a
    caller that plans them again from a new measurement (noise moves near-ties) takes these instead.
    """
    rdb = optuna.storages.RDBStorage(storage, engine_kwargs=engine_kwargs(storage))
    try:
        try:
            study_id = rdb.get_study_id_from_name(name)
        except KeyError:
            return None
        raw = rdb.get_study_user_attrs(study_id).get(S_RANK_ORDERS)
    finally:
        rdb.engine.dispose()
    return None if raw is None else tuple(RankOrder(n, tuple(nodes)) for n, nodes in json.loads(raw))


def engine_kwargs(url: str) -> dict[str, Any]:
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


def superseded_trials(trials: Sequence[FrozenTrial]) -> set[int]:
    retried = {t.user_attrs.get(A_RETRY_OF) for t in trials if A_RETRY_OF in t.user_attrs}
    return {t.number for t in trials if t.number in retried and t.state == TrialState.FAIL}


def logical_trials(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Trials counted against the budget: a stale trial that was retried counts through its retry."""
    gone = superseded_trials(trials)
    return [t for t in trials if t.number not in gone]
