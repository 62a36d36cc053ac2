"""The timing records learning jobs ship: checked against the job's pin, stored in one transaction, read back
per config version for the evidence.

A learning job's ``exec`` reads the profiler's records (``topo-tune-timing.*.txt``, one per communicator and
rank) when the job's command ends and sends their text here. A record is accepted only for a job pinned with a
learning arm (``learning.assignment``) and only when it names that arm: a job credential records what this
controller gave the job, for its own jobs only (``tenancy``). Each record is parsed whole
(``plugin.timing_record``: one line per error, naming ``records[i]``) before anything is stored; a call stores
all its records or none. A record already stored for (job, communicator, rank) stands: a retry is a no-op.

Divergence is detected after the fact, in the same transaction: the new records are compared with one stored
record of each of their communicators (those stored agree with each other, or the version's learning was
stopped when they came). Ranks that ran different choices for the same calls (``evidence.disagreement``) set
the version's kill switch, with a ``version.learning`` event naming the job: the hang the design rules out
came near, so no new job of that version explores until a person has looked (``admin learning version ID
--on``). Records still on their way (a rank missing) are not a disagreement.

Non-goals: reading the files (the CLI), comparing arms (``learning.evidence``), deleting old records
(``retention``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import ConfigVersionRow, JobTimingRow
from topo_tune.controller.tenancy import ADMIN, Tenant
from topo_tune.errors import QuotaExceeded, RecordError, ValidationError
from topo_tune.ids import ConfigVersionId
from topo_tune.jobs.config import JobPin
from topo_tune.learning.evidence import disagreement
from topo_tune.plugin.timing_record import (
    MAX_CALL_BYTES,
    MAX_RECORDS_PER_CALL,
    MAX_TIMING_BYTES,
    TimingRecord,
    parse_timing_record,
)

MAX_RECORDS_PER_JOB = 65_536
"""Records one job may store: beyond, a call is refused before anything is written."""


@dataclass(frozen=True)
class StoredTiming:
    """A stored record: its job, the arm its pin named, and the record itself."""

    job_id: str
    arm: int
    node: str
    record: TimingRecord


def parsed(texts: Sequence[str]) -> list[TimingRecord]:
    """Every record of a call, parsed; refused as a whole on the first bad one, naming ``records[i]``."""
    if len(texts) > MAX_RECORDS_PER_CALL:
        raise ValidationError("records", f"{len(texts)} records, at most {MAX_RECORDS_PER_CALL} in one call")
    size = sum(len(t.encode()) for t in texts)
    if size > MAX_CALL_BYTES:
        raise ValidationError("records", f"{size} bytes of records, at most {MAX_CALL_BYTES} in one call")
    records = []
    for i, text in enumerate(texts):
        if len(text.encode()) > MAX_TIMING_BYTES:
            raise ValidationError(f"records[{i}]", f"more than the {MAX_TIMING_BYTES} bytes a timing record may hold")
        try:
            records.append(parse_timing_record(text, source=""))
        except RecordError as error:
            why = str(error).lstrip(":").strip()
            raise ValidationError(f"records[{i}]", f"line {why}" if why[:1].isdigit() else why) from None
    return records


class StopLearning(Protocol):
    """Set a version's kill switch in the caller's transaction, with its event (``config_versions``)."""

    def __call__(self, session: Session, version_id: str, *, why: str, at: datetime) -> object: ...


@dataclass
class JobTimings:
    db: Database
    wall_clock: Callable[[], datetime]
    pins: Callable[[str], Awaitable[JobPin | None]]
    """The job's own pin (arm ""), where its learning arm is."""
    pin_owner: Callable[[str], Awaitable[str | None]]
    stop_learning: StopLearning
    """Called in the storing transaction when a job's ranks ran different choices."""

    async def record(self, job_id: str, node: str, texts: Sequence[str], *, tenant: Tenant = ADMIN) -> int:
        """Store a node's records of ``job_id``; returns how many were new. Refused, with nothing stored, when
        the job is not ``tenant``'s, does not learn, or a record is malformed or names another arm."""
        tenant.check_job(job_id)
        tenant.check_owner(job_id, await self.pin_owner(job_id))
        pin = await self.pins(job_id)
        if pin is None or pin.learning_arm is None:
            raise ValidationError("job_id", f"job {job_id!r} does not learn: no learning arm was pinned for it")
        records = parsed(texts)
        for i, record in enumerate(records):
            if record.arm != pin.learning_arm:
                raise ValidationError(
                    f"records[{i}].arm", f"{record.arm} is not the arm pinned for the job ({pin.learning_arm})"
                )
        at = self.wall_clock()
        arm, version = pin.learning_arm, pin.version

        def write(session: Session) -> int:
            # The version's row, locked: calls for its jobs take turns, so each sees the records stored before
            # it and no disagreement between two nodes' calls goes unseen.
            session.get(ConfigVersionRow, version, with_for_update=True)
            held = session.scalar(sa.select(sa.func.count()).where(JobTimingRow.job_id == job_id)) or 0
            if held + len(records) > MAX_RECORDS_PER_JOB:
                raise QuotaExceeded(f"job {job_id!r} holds {held} timing records, at most {MAX_RECORDS_PER_JOB}")
            new: list[TimingRecord] = []
            before: dict[str, list[TimingRecord]] = {}
            for record, text in zip(records, texts, strict=True):
                key = (job_id, f"{record.comm:x}", record.rank)
                if session.get(JobTimingRow, key) is not None:
                    continue  # a retry: the first copy stands
                if key[1] not in before:
                    before[key[1]] = _one_stored(session, job_id, key[1])
                row = JobTimingRow(
                    job_id=job_id, comm=key[1], rank=record.rank, config_version=version, arm=arm, node=node,
                    record=text, owner=tenant.owner, created_at=at,
                )  # fmt: skip
                session.add(row)
                session.flush()
                new.append(record)
            findings = disagreement([*new, *(r for stored in before.values() for r in stored)])
            if findings:
                why = f"by the controller: job {job_id}'s ranks ran different choices ({findings[0]})"
                self.stop_learning(session, version, why=why, at=at)
            return len(new)

        return await self.db.run(write)

    async def of_version(self, version: ConfigVersionId) -> list[StoredTiming]:
        """Every record stored for jobs of ``version``, oldest job first."""

        def read(session: Session) -> list[JobTimingRow]:
            query = sa.select(JobTimingRow).where(JobTimingRow.config_version == version)
            return list(session.scalars(query.order_by(JobTimingRow.created_at, JobTimingRow.job_id)))

        rows = await self.db.read(read)
        return [
            StoredTiming(r.job_id, r.arm, r.node, parse_timing_record(r.record, source=f"{r.job_id}/{r.comm}/{r.rank}"))
            for r in rows
        ]


def _one_stored(session: Session, job_id: str, comm: str) -> list[TimingRecord]:
    """One record stored before for the job's communicator, parsed (none when it is the first)."""
    text = session.scalar(
        sa.select(JobTimingRow.record).where(JobTimingRow.job_id == job_id, JobTimingRow.comm == comm).limit(1)
    )
    return [] if text is None else [parse_timing_record(text, source=f"{job_id}/{comm}")]
