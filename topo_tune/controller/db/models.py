"""The controller's tables. Every schema change comes with an Alembic migration (``migrations/versions``).

Agent wire messages that the controller stores whole (a node's topology, a command's body and result) are
kept as serialised protobuf: the outbox keeps what went on the wire. What the controller itself holds (a
job's spec and outcome, a study's request) is stored as its own JSON or columns, never as an admin message.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, ForeignKey, Index, Integer, LargeBinary, String, Text, TypeDecorator
from sqlalchemy import false as sa_false
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

VERSION_TABLE = "topo_tune_schema_version"
"""Alembic's version table for topo-tune's schema (Optuna's studies use ``alembic_version`` in the same database)."""


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UtcDateTime, dict[str, str]: JSON}


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    rack: Mapped[str] = mapped_column(String(253), default="")
    labels: Mapped[dict[str, str]] = mapped_column(default=dict)
    state: Mapped[str] = mapped_column(String(16))
    drained: Mapped[bool] = mapped_column(default=False)
    activity: Mapped[str] = mapped_column(String(16), default="idle")
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    backend: Mapped[str] = mapped_column(String(16), default="")
    instance_id: Mapped[str] = mapped_column(String(64), default="")
    applied_config_version: Mapped[str] = mapped_column(String(128), default="")
    topology: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    address: Mapped[str] = mapped_column(String(255), default="", server_default="")
    registrations: Mapped[int] = mapped_column(Integer, default=0)
    registered_at: Mapped[datetime]
    last_heartbeat_at: Mapped[datetime]
    state_changed_at: Mapped[datetime]


class CommandRow(Base):
    __tablename__ = "commands"
    __table_args__ = (Index("ix_commands_node_status", "node_name", "status"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_name: Mapped[str] = mapped_column(ForeignKey("nodes.name"))
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    body: Mapped[bytes] = mapped_column(LargeBinary)
    status: Mapped[str] = mapped_column(String(16))
    deliveries: Mapped[int] = mapped_column(Integer, default=0)
    message: Mapped[str] = mapped_column(Text, default="")
    result: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime]
    sent_at: Mapped[datetime | None]
    acked_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_node_at", "node_name", "at"), Index("ix_events_at", "at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_name: Mapped[str] = mapped_column(String(253))
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    command_id: Mapped[str] = mapped_column(String(64), default="")
    at: Mapped[datetime]


class BenchmarkJobRow(Base):
    """A benchmark job across nodes; its per-node work are the commands whose ``job_id`` is its id."""

    __tablename__ = "benchmark_jobs"
    __table_args__ = (
        Index("ix_benchmark_jobs_status", "status"),
        Index("ix_benchmark_jobs_created_at", "created_at"),  # retention walks the oldest first
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")
    backend: Mapped[str] = mapped_column(String(16))
    nodes: Mapped[list[str]] = mapped_column(JSON)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    """The job's ``BenchmarkSpec`` (its JSON form); the ``RunBenchmark`` each node was sent is its command's body."""
    outcome: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """A finished job's ``JobOutcome`` (its JSON form): aggregated rows, missing and hung ranks."""
    created_at: Mapped[datetime]
    deadline_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class ProbeRoundRow(Base):
    """One round of pairwise node-to-node probes (every pair once, in rounds of disjoint pairs)."""

    __tablename__ = "probe_rounds"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))  # running, succeeded, failed
    message: Mapped[str] = mapped_column(Text, default="")
    nodes: Mapped[list[str]] = mapped_column(JSON)
    message_bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    sampling: Mapped[str] = mapped_column(String(16), default="full", server_default="full")  # full, sparse
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    """Sparse rounds: pairs planned, rounds run and what the sample shows (slow NICs, uplinks, pairs)."""


class PairMeasurementRow(Base):
    """A measured node pair: it replaces the modelled figure, with its time and method."""

    __tablename__ = "pair_measurements"
    __table_args__ = (Index("ix_pair_measurements_pair", "node_a", "node_b", "measured_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[str] = mapped_column(ForeignKey("probe_rounds.id"))
    node_a: Mapped[str] = mapped_column(String(253))
    node_b: Mapped[str] = mapped_column(String(253))
    bandwidth_gbps: Mapped[float]
    """GB/s, sendrecv algbw at the round's message size."""
    latency_us: Mapped[float]
    method: Mapped[str] = mapped_column(String(128))
    measured_at: Mapped[datetime]


class ConfigVersionRow(Base):
    """An immutable, content-addressed config version (``config_version.ConfigVersion``)."""

    __tablename__ = "config_versions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    files: Mapped[dict[str, str]] = mapped_column()
    provenance: Mapped[dict[str, str]] = mapped_column(default=dict)
    created_at: Mapped[datetime]
    learning_stopped: Mapped[bool] = mapped_column(default=False, server_default=sa_false())
    """The version's kill switch for learning (``admin learning version ID --off``): outside the content id, the
    one thing about a stored version that changes; new jobs of the version then run its chosen table."""
    learning_stopped_why: Mapped[str] = mapped_column(String(1024), default="", server_default="")
    """Why the kill switch is set (``by ACTOR``, or the job whose ranks disagreed); empty when it is not."""


class RolloutRow(Base):
    __tablename__ = "rollouts"
    __table_args__ = (Index("ix_rollouts_phase", "phase"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    config_version: Mapped[str] = mapped_column(ForeignKey("config_versions.id"))
    previous_version: Mapped[str] = mapped_column(String(32), default="")
    phase: Mapped[str] = mapped_column(String(16))
    wave: Mapped[int] = mapped_column(Integer, default=0)
    gate_attempt: Mapped[int] = mapped_column(Integer, default=1)
    reason: Mapped[str] = mapped_column(Text, default="")
    paused_from: Mapped[str] = mapped_column(String(16), default="")
    resume_at: Mapped[datetime | None]
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)
    thresholds: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(253), default="")
    revision: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class RolloutWaveRow(Base):
    __tablename__ = "rollout_waves"

    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(16))
    racks: Mapped[list[str]] = mapped_column(JSON)
    tiers: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    """The network tiers above the wave's racks, top first (the plan's group)."""
    phase: Mapped[str] = mapped_column(String(16))


class RolloutNodeRow(Base):
    __tablename__ = "rollout_nodes"

    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id"), primary_key=True)
    node_name: Mapped[str] = mapped_column(String(253), primary_key=True)
    wave: Mapped[int] = mapped_column(Integer)
    position: Mapped[int] = mapped_column(Integer)
    """The node's place in the plan, so a reloaded wave lists its nodes in the planned order."""
    phase: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=1)


class GateResultRow(Base):
    """A wave gate's verdict with the raw A/B samples it was judged on."""

    __tablename__ = "gate_results"

    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id"), primary_key=True)
    wave: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    outcome: Mapped[str] = mapped_column(String(16))
    verdict: Mapped[dict[str, Any]] = mapped_column(JSON)
    samples: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    measured_at: Mapped[datetime]


class RolloutAuditRow(Base):
    """One transition of a rollout, a wave or a node, and who or what caused it."""

    __tablename__ = "rollout_audit"
    __table_args__ = (Index("ix_rollout_audit_rollout", "rollout_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id"))
    revision: Mapped[int] = mapped_column(Integer)
    subject: Mapped[str] = mapped_column(String(300))
    before: Mapped[str] = mapped_column(String(16))
    after: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(253))
    message: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime]


class JobPinRow(Base):
    """The config version and node order a job was given (per arm: "" its own, or one ``exec --compare``
    names), so all its ranks get the same ones for its whole life."""

    __tablename__ = "job_pins"
    __table_args__ = (Index("ix_job_pins_owner", "owner"),)

    job_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    arm: Mapped[str] = mapped_column(String(32), primary_key=True, default="")
    config_version: Mapped[str] = mapped_column(String(32))
    nodes: Mapped[list[str]] = mapped_column(JSON)
    node_order: Mapped[list[str]] = mapped_column(JSON, default=list)
    rollout_id: Mapped[str] = mapped_column(String(64), default="")
    owner: Mapped[str] = mapped_column(String(16), default="", server_default="")
    """The id of the job credential that pinned the job first ("" = the admin): the job's owner (``tenancy``)."""
    created_at: Mapped[datetime]
    learning_arm: Mapped[int | None] = mapped_column(Integer, default=None)
    """The table the job runs for its life when it learns (0: the chosen one, i: the i-th challenger); None: the
    job does not learn (``learning.assignment``)."""


class JobTimingRow(Base):
    """One communicator's timing record on one rank of a learning job (``plugin.timing_record``), as the job's
    ``exec`` shipped it; the record's text is kept whole and parsed again when the evidence is read."""

    __tablename__ = "job_timings"
    __table_args__ = (
        Index("ix_job_timings_version", "config_version"),
        Index("ix_job_timings_created_at", "created_at"),
    )

    job_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    comm: Mapped[str] = mapped_column(String(16), primary_key=True)
    """The communicator's id, as the record's hex."""
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    config_version: Mapped[str] = mapped_column(String(32))
    arm: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(253))
    record: Mapped[str] = mapped_column(Text)
    owner: Mapped[str] = mapped_column(String(16), default="", server_default="")
    created_at: Mapped[datetime]


class StudyRow(Base):
    """A study the controller runs (``admin study start``); its trials live in Optuna's tables (which include
    one called ``studies``, hence this table's name)."""

    __tablename__ = "tuning_studies"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))  # running, succeeded, failed, cancelled
    message: Mapped[str] = mapped_column(Text, default="")
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # StudyRequest.to_json()
    nodes: Mapped[list[str]] = mapped_column(JSON)
    optuna_name: Mapped[str] = mapped_column(String(512), default="")
    result: Mapped[str] = mapped_column(String(64), default="")
    config_version: Mapped[str] = mapped_column(String(32), default="")
    simulated: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class DriftCheckRow(Base):
    """A drift check: the active config version re-measured on a sample of nodes against its reference, or a
    node whose topology fingerprint changed when it registered again."""

    __tablename__ = "drift_checks"
    __table_args__ = (Index("ix_drift_checks_created_at", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # benchmark, topology
    status: Mapped[str] = mapped_column(String(16))  # running, ok, regressed, failed, skipped, changed
    message: Mapped[str] = mapped_column(Text, default="")
    config_version: Mapped[str] = mapped_column(String(32), default="")
    rollout_id: Mapped[str] = mapped_column(String(64), default="")
    """The completed rollout whose gate measured the reference."""
    wave: Mapped[int | None] = mapped_column(Integer, nullable=True)
    nodes: Mapped[list[str]] = mapped_column(JSON)
    reference_busbw_gbps: Mapped[float | None]
    measured_busbw_gbps: Mapped[float | None]
    threshold: Mapped[float | None]
    p_value: Mapped[float | None]
    """The one-sided p-value that the drop is at most ``threshold`` (``bandwidth_drop``)."""
    alpha: Mapped[float | None]
    job_ids: Mapped[list[str]] = mapped_column(JSON)
    study_id: Mapped[str] = mapped_column(String(64), default="")
    simulated: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class LeaderEpochRow(Base):
    """The one row of the leader fence (``fence.py``): the epoch of the leader whose writes may commit."""

    __tablename__ = "leader_epoch"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    """Always ``fence.ROW_ID``: one row, read by primary key."""
    epoch: Mapped[int] = mapped_column(Integer)
    """The Lease's ``leaseTransitions`` at the start of the newest leader's term (-1 before any)."""
    holder: Mapped[str] = mapped_column(String(253), default="")
    claimed_at: Mapped[datetime | None]


class JobComparisonRow(Base):
    """A job's own A/B (``exec --compare``): what the job recorded, run by run, and the figures once complete."""

    __tablename__ = "job_comparisons"
    __table_args__ = (
        Index("ix_job_comparisons_created_at", "created_at"),
        Index("ix_job_comparisons_job", "job_id"),
        Index("ix_job_comparisons_owner", "owner"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Derived from the job id and the two arms as named, so every node's record lands in the same row."""
    job_id: Mapped[str] = mapped_column(String(253))
    owner: Mapped[str] = mapped_column(String(16), default="", server_default="")
    """The id of the job credential that recorded it first ("" = the admin) (``tenancy``)."""
    header: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Arms, their versions and node orders, the metric, pairs, nodes: the same in every node's record."""
    runs: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    """Recorded runs in schedule order: index, pair, arm, value, node."""
    figures: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Medians, gain, bounds, decision; None until every run is in."""
    created_at: Mapped[datetime]
    completed_at: Mapped[datetime | None]


class CredentialRow(Base):
    """An agent or job credential as issued: its id (a short hash of the token, never the token), role, node,
    when, and when it was revoked."""

    __tablename__ = "credentials"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    node_name: Mapped[str] = mapped_column(String(253), default="")
    scope: Mapped[str] = mapped_column(String(253), default="", server_default="")
    """A job credential's job-id prefix ("" = any job id)."""
    issued_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
