"""Drift checks in the database: one ``drift_checks`` row per check, and the events of a regression.

A benchmark check is written ``running`` (with its nodes and job ids) before its jobs start and finished
with its verdict; one that measured nothing is written ``skipped`` with the reason; a changed topology is
written ``changed``. The verdict and its per-node events are one transaction. Non-goals: deciding anything
(``checker.py``, ``verdict.py``) and deleting old checks (``retention.py``).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.db.database import Database
from topo_tune.controller.db.left_running import end_left_running
from topo_tune.controller.db.models import BenchmarkJobRow, DriftCheckRow, EventRow
from topo_tune.controller.drift.verdict import DriftKind, DriftStatus, DriftVerdict, Reference
from topo_tune.drift_record import DriftCheck
from topo_tune.errors import NotFoundError, ValidationError
from topo_tune.ids import ConfigVersionId, NodeName


@dataclass(frozen=True)
class DriftStore:
    db: Database
    wall_clock: Callable[[], datetime]

    async def recover(self) -> int:
        """At start-up: checks a previous controller was running end ``failed`` (the next check measures again)."""
        return await end_left_running(
            self.db,
            DriftCheckRow,
            status=DriftStatus.FAILED.value,
            message="the controller stopped during the check",
            at=self.wall_clock(),
        )

    async def running_check(self) -> str:
        """The id of a benchmark check still measuring ("" if none)."""

        def read(session: Session) -> str:
            query = sa.select(DriftCheckRow.id).where(DriftCheckRow.status == DriftStatus.RUNNING.value).limit(1)
            return session.scalar(query) or ""

        return await self.db.run(read)

    async def add_skipped(self, check_id: str, *, version: str, reason: str, threshold: float) -> None:
        now = self.wall_clock()
        row = DriftCheckRow(
            id=check_id,
            kind=DriftKind.BENCHMARK.value,
            status=DriftStatus.SKIPPED.value,
            message=reason,
            config_version=version,
            nodes=[],
            job_ids=[],
            threshold=threshold,
            created_at=now,
            finished_at=now,
        )
        await self.db.run(lambda session: session.add(row))

    async def add_running(
        self,
        check_id: str,
        *,
        version: str,
        reference: Reference,
        nodes: Sequence[str],
        job_ids: Sequence[str],
        threshold: float,
    ) -> None:
        row = DriftCheckRow(
            id=check_id,
            kind=DriftKind.BENCHMARK.value,
            status=DriftStatus.RUNNING.value,
            message="",
            config_version=version,
            rollout_id=reference.rollout_id,
            wave=reference.wave,
            nodes=list(nodes),
            reference_busbw_gbps=reference.busbw_gbps,
            threshold=threshold,
            job_ids=list(job_ids),
            created_at=self.wall_clock(),
        )
        await self.db.run(lambda session: session.add(row))

    async def add_topology_change(
        self, check_id: str, *, node: NodeName, before: str, after: str, version: ConfigVersionId
    ) -> None:
        now = self.wall_clock()
        row = DriftCheckRow(
            id=check_id,
            kind=DriftKind.TOPOLOGY.value,
            status=DriftStatus.CHANGED.value,
            message=f"topology fingerprint {before} -> {after}",
            config_version=version,
            nodes=[node],
            job_ids=[],
            created_at=now,
            finished_at=now,
        )
        await self.db.run(lambda session: session.add(row))

    async def end_failed(self, check_id: str, reason: str) -> None:
        """A check still ``running`` ends ``failed`` with ``reason``."""
        now = self.wall_clock()

        def write(session: Session) -> None:
            row = session.get(DriftCheckRow, check_id)
            if row is not None and row.status == DriftStatus.RUNNING.value:
                row.status, row.message, row.finished_at = DriftStatus.FAILED.value, reason, now

        await self.db.run(write)

    async def finish(self, check_id: str, verdict: DriftVerdict, *, alpha: float) -> list[str]:
        """Store the verdict, and on a regression an event per node, in one transaction; returns the nodes."""
        now = self.wall_clock()

        def write(session: Session) -> list[str]:
            row = session.get(DriftCheckRow, check_id)
            assert row is not None
            row.status, row.message, row.finished_at = verdict.status.value, verdict.message, now
            row.measured_busbw_gbps, row.simulated = verdict.measured_busbw_gbps, verdict.simulated
            row.p_value, row.alpha = verdict.p_value, alpha
            if verdict.status is DriftStatus.REGRESSED:
                session.add_all(
                    EventRow(node_name=node, kind="drift.regressed", message=f"{check_id}: {verdict.message}", at=now)
                    for node in row.nodes
                )
            return list(row.nodes)

        return await self.db.run(write)

    async def note_study(self, check_id: str, *, study_id: str, note: str) -> None:
        """Record the study a check opened (or why none was), after the check's message."""

        def write(session: Session) -> None:
            row = session.get(DriftCheckRow, check_id)
            if row is not None:
                row.study_id, row.message = study_id, f"{row.message}; {note}"

        await self.db.run(write)

    async def get(self, check_id: str) -> DriftCheck:
        row = await self.db.run(lambda session: session.get(DriftCheckRow, check_id))
        if row is None:
            raise NotFoundError(f"no drift check {check_id!r}")
        return _check(row)

    async def progress(self, check_id: str) -> tuple[DriftCheck, int]:
        """The check now, with how many of its benchmark jobs have ended."""

        def read(session: Session) -> tuple[DriftCheckRow | None, int]:
            row = session.get(DriftCheckRow, check_id)
            if row is None or not row.job_ids:
                return row, 0
            ended = sa.select(sa.func.count()).where(
                BenchmarkJobRow.id.in_(row.job_ids), BenchmarkJobRow.status != "running"
            )
            return row, int(session.scalar(ended) or 0)

        row, ended = await self.db.run(read)
        if row is None:
            raise NotFoundError(f"no drift check {check_id!r}")
        return _check(row), ended

    async def list(self, *, limit: int = 50, status: str = "") -> builtins.list[DriftCheck]:
        if status and status not in DriftStatus.__members__.values():
            known = ", ".join(s.value for s in DriftStatus)
            raise ValidationError("status", f"one of {known}, got {status!r}")

        def read(session: Session) -> builtins.list[DriftCheckRow]:
            newest_first = (DriftCheckRow.created_at.desc(), DriftCheckRow.id.desc())
            query = sa.select(DriftCheckRow).order_by(*newest_first).limit(limit)
            if status:
                query = query.where(DriftCheckRow.status == status)
            return builtins.list(session.scalars(query))

        return [_check(row) for row in await self.db.run(read)]


# Wire messages: the admin API's view of a stored check.


def _check(row: DriftCheckRow) -> DriftCheck:
    return DriftCheck(
        check_id=row.id,
        kind=row.kind,
        status=row.status,
        message=row.message,
        config_version=row.config_version,
        rollout_id=row.rollout_id,
        nodes=tuple(row.nodes),
        job_ids=tuple(row.job_ids),
        study_id=row.study_id,
        simulated=row.simulated,
        created_at=row.created_at,
        finished_at=row.finished_at,
        wave=row.wave,
        reference_busbw_gbps=row.reference_busbw_gbps,
        measured_busbw_gbps=row.measured_busbw_gbps,
        threshold=row.threshold,
        p_value=row.p_value,
        alpha=row.alpha,
    )
