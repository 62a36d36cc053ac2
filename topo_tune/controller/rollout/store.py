"""Persistence of rollouts: snapshots, steps with their audit entries, gate results, job pins.

A step is committed in one transaction together with its audit entries, and only if the rollout's
``revision`` is still the one the step was computed from (optimistic concurrency): an operator's verb and
the engine's reconcile pass can never both win from the same snapshot. At most one rollout is active
(not ``completed``, ``rolled_back`` or ``aborted``) at a time.

Non-goals: deciding transitions (``state.py``), acting on them (``engine.py``), storing config versions
(``controller/config_versions.py``; ``versions`` here is that store).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.config.cluster import JobCapsConfig, RolloutThresholdsConfig
from topo_tune.controller.config_versions import ConfigVersions
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import (
    ConfigVersionRow,
    GateResultRow,
    JobPinRow,
    RolloutAuditRow,
    RolloutNodeRow,
    RolloutRow,
    RolloutWaveRow,
)
from topo_tune.controller.rollout.gates import GateVerdict, Outcome, Sample
from topo_tune.controller.rollout.plan import PlanPolicy, WaveKind
from topo_tune.controller.rollout.state import (
    NodePhase,
    NodeRollout,
    Rollout,
    RolloutPhase,
    Snapshot,
    Step,
    WavePhase,
    WaveState,
)
from topo_tune.controller.tenancy import ADMIN, CAPS, Tenant
from topo_tune.errors import AlreadyExists, ConflictError, NotFoundError, StorageError
from topo_tune.ids import NO_CONFIG_VERSION, ConfigVersionId, NodeName, RolloutId
from topo_tune.jobs.config import JobPin
from topo_tune.learning.assignment import ArmIndex
from topo_tune.rollout_record import RolloutTransition

ACTIVE_PHASES = [p.value for p in RolloutPhase if not p.final]


@dataclass(frozen=True)
class AuditRecord(RolloutTransition):
    """A transition as the store keeps it: with the rollout's revision that it made."""

    revision: int


@dataclass(frozen=True)
class GateRecord:
    wave: int
    attempt: int
    verdict: GateVerdict
    samples: tuple[Sample, ...]
    measured_at: datetime


def _rollout_from_row(row: RolloutRow) -> Rollout:
    return Rollout(
        id=RolloutId(row.id),
        config_version=ConfigVersionId(row.config_version),
        previous_version=ConfigVersionId(row.previous_version),
        phase=RolloutPhase(row.phase),
        policy=PlanPolicy.from_json(row.policy),
        thresholds=RolloutThresholdsConfig.model_validate(row.thresholds),
        created_by=row.created_by,
        wave=row.wave,
        gate_attempt=row.gate_attempt,
        reason=row.reason,
        paused_from=RolloutPhase(row.paused_from) if row.paused_from else None,
        resume_at=row.resume_at,
        revision=row.revision,
    )


def _write_rollout(row: RolloutRow, rollout: Rollout, at: datetime) -> None:
    row.phase = rollout.phase.value
    row.wave = rollout.wave
    row.gate_attempt = rollout.gate_attempt
    row.reason = rollout.reason
    row.paused_from = rollout.paused_from.value if rollout.paused_from else ""
    row.resume_at = rollout.resume_at
    row.revision = rollout.revision
    row.updated_at = at


def _verdict_from_json(data: dict[str, object]) -> GateVerdict:
    fields = {f.name for f in dataclasses.fields(GateVerdict)}
    values = {k: v for k, v in data.items() if k in fields}
    values["outcome"] = Outcome(str(values["outcome"]))
    values["reasons"] = tuple(values.get("reasons", ()))  # type: ignore[arg-type]
    values["lost_nodes"] = tuple(values.get("lost_nodes", ()))  # type: ignore[arg-type]
    return GateVerdict(**values)  # type: ignore[arg-type]


def _load(session: Session, row: RolloutRow) -> Snapshot:
    waves = session.scalars(
        sa.select(RolloutWaveRow).where(RolloutWaveRow.rollout_id == row.id).order_by(RolloutWaveRow.index)
    ).all()
    node_rows = session.scalars(sa.select(RolloutNodeRow).where(RolloutNodeRow.rollout_id == row.id)).all()
    members: dict[int, list[NodeName]] = {}
    for node in sorted(node_rows, key=lambda n: n.position):
        members.setdefault(node.wave, []).append(NodeName(node.node_name))
    return Snapshot(
        rollout=_rollout_from_row(row),
        waves=tuple(
            WaveState(
                w.index,
                WaveKind(w.kind),
                tuple(w.racks),
                tuple(members.get(w.index, [])),
                WavePhase(w.phase),
                tuple(w.tiers),
            )
            for w in waves
        ),
        nodes={NodeName(n.node_name): NodeRollout(n.wave, NodePhase(n.phase), n.attempt) for n in node_rows},
    )


@dataclass
class RolloutStore:
    db: Database
    wall_clock: Callable[[], datetime]
    versions: ConfigVersions = field(init=False)
    """The config versions rollouts refer to (stored through the same object as the admin config RPCs)."""

    def __post_init__(self) -> None:
        self.versions = ConfigVersions(db=self.db, wall_clock=self.wall_clock)

    async def create(self, step: Step) -> Snapshot:
        """Store a new rollout; ``ConflictError`` while another rollout is active."""
        snapshot, at = step.snapshot, self.wall_clock()
        rollout = snapshot.rollout

        def write(session: Session) -> None:
            active = session.scalars(sa.select(RolloutRow.id).where(RolloutRow.phase.in_(ACTIVE_PHASES))).first()
            if active is not None:
                raise ConflictError(f"rollout {active} is still active; finish, abort or roll it back first")
            if session.get(RolloutRow, rollout.id) is not None:
                raise AlreadyExists(f"a rollout named {rollout.id!r} exists already")
            if session.get(ConfigVersionRow, rollout.config_version) is None:
                raise NotFoundError(f"no config version {rollout.config_version!r}")
            position = {n: i for i, n in enumerate(n for w in snapshot.waves for n in w.nodes)}
            row = RolloutRow(
                id=rollout.id,
                config_version=rollout.config_version,
                previous_version=rollout.previous_version,
                policy=rollout.policy.to_json(),
                thresholds=rollout.thresholds.model_dump(),
                created_by=rollout.created_by,
                created_at=at,
            )
            _write_rollout(row, rollout, at)
            session.add(row)
            session.flush()
            session.add_all(
                RolloutWaveRow(
                    rollout_id=rollout.id,
                    index=w.index,
                    kind=w.kind.value,
                    racks=list(w.racks),
                    tiers=list(w.group),
                    phase=w.phase,
                )
                for w in snapshot.waves
            )
            session.add_all(
                RolloutNodeRow(
                    rollout_id=rollout.id,
                    node_name=name,
                    wave=n.wave,
                    position=position[name],
                    phase=n.phase,
                    attempt=n.attempt,
                )
                for name, n in snapshot.nodes.items()
            )
            self._audit(session, rollout.id, revision=rollout.revision, step=step, at=at)

        await self.db.run(write)
        return snapshot

    @staticmethod
    def _audit(session: Session, rollout_id: RolloutId, *, revision: int, step: Step, at: datetime) -> None:
        session.add_all(
            RolloutAuditRow(
                rollout_id=rollout_id,
                revision=revision,
                subject=e.subject,
                before=e.before,
                after=e.after,
                actor=e.actor,
                message=e.message,
                at=at,
            )
            for e in step.audit
        )

    async def commit(self, before: Snapshot, step: Step) -> Snapshot:
        """Persist ``step`` if the rollout is still at ``before``'s revision; ``ConflictError`` otherwise."""
        after, at = step.snapshot, self.wall_clock()
        rollout_id = before.rollout.id

        def write(session: Session) -> None:
            row = session.get(RolloutRow, rollout_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no rollout {rollout_id!r}")
            if row.revision != before.rollout.revision:
                raise ConflictError(f"rollout {rollout_id} changed meanwhile (revision {row.revision}); try again")
            _write_rollout(row, after.rollout, at)
            for old, new in zip(before.waves, after.waves, strict=True):
                if old.phase != new.phase:
                    session.execute(
                        sa.update(RolloutWaveRow)
                        .where(RolloutWaveRow.rollout_id == rollout_id, RolloutWaveRow.index == new.index)
                        .values(phase=new.phase.value)
                    )
            changed = [(name, n) for name, n in after.nodes.items() if before.nodes[name] != n]
            for name, node in changed:
                session.execute(
                    sa.update(RolloutNodeRow)
                    .where(RolloutNodeRow.rollout_id == rollout_id, RolloutNodeRow.node_name == name)
                    .values(phase=node.phase.value, attempt=node.attempt)
                )
            self._audit(session, rollout_id, revision=after.rollout.revision, step=step, at=at)

        await self.db.run(write)
        return after

    async def load(self, rollout_id: RolloutId) -> Snapshot:
        def read(session: Session) -> Snapshot:
            row = session.get(RolloutRow, rollout_id)
            if row is None:
                raise NotFoundError(f"no rollout {rollout_id!r}")
            return _load(session, row)

        return await self.db.read(read)

    async def active(self) -> Snapshot | None:
        def read(session: Session) -> Snapshot | None:
            row = session.scalars(sa.select(RolloutRow).where(RolloutRow.phase.in_(ACTIVE_PHASES))).first()
            return _load(session, row) if row is not None else None

        return await self.db.read(read)

    async def recent(self, *, limit: int = 50) -> list[Rollout]:
        def read(session: Session) -> list[Rollout]:
            rows = session.scalars(sa.select(RolloutRow).order_by(RolloutRow.created_at.desc()).limit(limit))
            return [_rollout_from_row(r) for r in rows]

        return await self.db.read(read)

    async def stable(self) -> Rollout | None:
        """The last completed rollout: its version is the one the fleet runs when no rollout is active."""

        def read(session: Session) -> Rollout | None:
            row = session.scalars(
                sa.select(RolloutRow)
                .where(RolloutRow.phase == RolloutPhase.COMPLETED.value)
                .order_by(RolloutRow.updated_at.desc())
            ).first()
            return _rollout_from_row(row) if row is not None else None

        return await self.db.read(read)

    async def stable_version(self) -> ConfigVersionId:
        """The version the fleet runs when no rollout is active: the last completed rollout's ("" if none)."""
        stable = await self.stable()
        return stable.config_version if stable is not None else NO_CONFIG_VERSION

    async def save_gate(
        self, rollout_id: RolloutId, *, wave: int, attempt: int, verdict: GateVerdict, samples: Sequence[Sample]
    ) -> GateVerdict:
        """Store a gate result; if one exists for this wave and attempt, that one stands and is returned."""
        at = self.wall_clock()

        def write(session: Session) -> GateVerdict:
            existing = session.get(GateResultRow, (rollout_id, wave, attempt))
            if existing is not None:
                return _verdict_from_json(existing.verdict)
            session.add(
                GateResultRow(
                    rollout_id=rollout_id,
                    wave=wave,
                    attempt=attempt,
                    outcome=verdict.outcome.value,
                    verdict=verdict.to_json(),
                    samples=[dataclasses.asdict(s) for s in samples],
                    measured_at=at,
                )
            )
            return verdict

        return await self.db.run(write)

    async def gate(self, rollout_id: RolloutId, *, wave: int, attempt: int) -> GateVerdict | None:
        row = await self.db.read(lambda session: session.get(GateResultRow, (rollout_id, wave, attempt)))
        return _verdict_from_json(row.verdict) if row is not None else None

    async def gates(self, rollout_id: RolloutId) -> list[GateRecord]:
        def read(session: Session) -> list[GateRecord]:
            rows = session.scalars(
                sa.select(GateResultRow)
                .where(GateResultRow.rollout_id == rollout_id)
                .order_by(GateResultRow.wave, GateResultRow.attempt)
            )
            return [
                GateRecord(
                    r.wave,
                    r.attempt,
                    _verdict_from_json(r.verdict),
                    tuple(Sample(**s) for s in r.samples),
                    r.measured_at,
                )
                for r in rows
            ]

        return await self.db.read(read)

    async def history(self, rollout_id: RolloutId) -> list[AuditRecord]:
        def read(session: Session) -> list[AuditRecord]:
            if session.get(RolloutRow, rollout_id) is None:
                raise NotFoundError(f"no rollout {rollout_id!r}")
            rows = session.scalars(
                sa.select(RolloutAuditRow).where(RolloutAuditRow.rollout_id == rollout_id).order_by(RolloutAuditRow.id)
            )
            return [
                AuditRecord(
                    at=r.at,
                    subject=r.subject,
                    before=r.before,
                    after=r.after,
                    actor=r.actor,
                    message=r.message,
                    revision=r.revision,
                )
                for r in rows
            ]

        return await self.db.read(read)

    async def prune_pins(self, *, older_than: datetime) -> int:
        """Forget pins made before ``older_than`` (jobs that old have ended); returns how many."""

        def write(session: Session) -> int:
            result = session.execute(sa.delete(JobPinRow).where(JobPinRow.created_at < older_than))
            return int(result.rowcount or 0)  # type: ignore[attr-defined]

        return await self.db.run(write)

    async def get_pin(self, job_id: str, *, arm: str = "") -> JobPin | None:
        row = await self.db.read(lambda session: session.get(JobPinRow, (job_id, arm)))
        if row is None:
            return None
        return JobPin(
            row.job_id,
            ConfigVersionId(row.config_version),
            tuple(row.nodes),
            tuple(row.node_order),
            row.arm,
            learning_arm=None if row.learning_arm is None else ArmIndex(row.learning_arm),
        )

    async def pin_owner(self, job_id: str) -> str | None:
        """Who owns ``job_id``'s pins (``tenancy``): the credential of its first pin; None when it has none."""
        return await self.db.read(
            lambda session: session.scalar(sa.select(JobPinRow.owner).where(JobPinRow.job_id == job_id).limit(1))
        )

    async def pin(
        self, pin: JobPin, *, rollout_id: RolloutId, tenant: Tenant = ADMIN, caps: JobCapsConfig = CAPS
    ) -> JobPin:
        """Store ``pin`` (version and node order, under its job id and arm, owned by ``tenant``) unless the job
        is pinned already; returns the pin that stands. Refused, with nothing stored, when the job is another
        tenant's or the tenant holds its cap of pins."""
        at = self.wall_clock()

        def write(session: Session) -> None:
            if session.get_bind().dialect.name == "postgresql":
                # Two tenants pinning two arms of one new job id at once would each see no owner: the job's
                # first pins are made one at a time (SQLite writes one transaction at a time anyway).
                session.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(pin.job_id))))
            owners = sa.select(JobPinRow.owner).where(JobPinRow.job_id == pin.job_id).limit(1)
            tenant.check_owner(pin.job_id, session.scalar(owners))
            if session.get(JobPinRow, (pin.job_id, pin.arm)) is None:
                owned = sa.select(sa.func.count()).where(JobPinRow.owner == tenant.owner)
                tenant.check_count(session.scalar(owned) or 0, caps.pins_per_credential, "pins")
                session.add(
                    JobPinRow(
                        job_id=pin.job_id,
                        arm=pin.arm,
                        config_version=pin.version,
                        nodes=list(pin.nodes),
                        node_order=list(pin.order),
                        rollout_id=rollout_id,
                        owner=tenant.owner,
                        created_at=at,
                        learning_arm=pin.learning_arm,
                    )
                )

        try:
            await self.db.run(write)
        except StorageError as error:
            if not isinstance(error.__cause__, sa.exc.IntegrityError):
                raise
            # Another rank of the same job pinned it a moment ago: that pin stands.
        stored = await self.get_pin(pin.job_id, arm=pin.arm)
        assert stored is not None
        return stored
