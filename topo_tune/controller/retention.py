"""Retention: old benchmark results, events, drift checks and job comparisons are deleted; what something
refers to is kept.

A scheduled pass (leader only) deletes what is older than ``max_age``:

- **benchmark jobs** that have ended, each together with its per-node commands (and their results), in
  one transaction, so a job is never left without its commands or the reverse. Kept whatever their age:
  the jobs behind a rollout's stored gate samples (rollouts and their gate results are never deleted: they
  are the audit trail of what runs on the fleet), the jobs of drift checks still kept, and the jobs of a
  study that chose a config version (those run on its nodes while it ran: which of them measured the
  chosen trial is not recorded, so all of them stay). Trials themselves live in Optuna's tables, which
  retention never touches; neither does it touch config versions, rollouts, job pins (``job-pin-retention``)
  or probe measurements (the newest per pair is what the cluster model uses).
- **events** (registrations, lost/ready, ignored results, drift regressions).
- **drift checks** that have ended.
- **job comparisons** (``exec --compare``, complete or not) older than ``job_comparison_max_age``: a job
  credential holds a capped number of them (``tenancy``), so retention is what frees its room.
- **timing records** of learning jobs (``job_timings``): a job's all together, never some of its ranks (the
  evidence compares them with each other and sets aside a job missing one), when its newest is older than
  ``job_timing_max_age``; then, while more than ``job_timing_max_records`` are held, the oldest jobs'. Config
  versions, and so a kill switch learning set, stay.

Deletion runs in batches of ``batch_size`` rows (timing records: whole jobs up to that many records, at
least one job), one transaction each, so the database is never locked for
long and a pass that stops half-way has deleted whole batches only.

Non-goals: scheduling (the controller's scheduler calls :meth:`Retention.run`); bounding the
``result.ignored`` events of a misbehaving agent between passes (``CommandBook`` keeps the newest per node).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.config.cluster import RetentionConfig
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import (
    BenchmarkJobRow,
    CommandRow,
    DriftCheckRow,
    EventRow,
    GateResultRow,
    JobComparisonRow,
    JobTimingRow,
    StudyRow,
)
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.rollout.verification import gate_job_id

logger = logging.getLogger(__name__)

_RUNNING = "running"


@dataclass(frozen=True)
class RetentionReport:
    """What one pass deleted."""

    benchmark_jobs: int = 0
    commands: int = 0
    events: int = 0
    drift_checks: int = 0
    job_comparisons: int = 0
    job_timings: int = 0


@dataclass(frozen=True)
class _Keep:
    """What the benchmark jobs older than the cutoff must not lose."""

    job_ids: frozenset[str]
    study_windows: tuple[tuple[datetime, datetime, frozenset[str]], ...]

    def keeps(self, job: tuple[str, datetime, list[str]]) -> bool:
        job_id, created_at, nodes = job
        if job_id in self.job_ids:
            return True
        return any(start <= created_at <= end and set(nodes) <= members for start, end, members in self.study_windows)


@dataclass
class Retention:
    db: Database
    wall_clock: Callable[[], datetime]
    settings: RetentionConfig = field(default_factory=RetentionConfig)
    metrics: ControllerMetrics | None = None

    async def run(self) -> RetentionReport:
        """One pass: delete everything older than ``max_age`` that nothing refers to."""
        if not self.settings.enabled:
            return RetentionReport()
        now = self.wall_clock()
        cutoff = now - timedelta(seconds=self.settings.max_age)
        drift_checks = await self._delete_drift_checks(cutoff)
        keep = await self.db.run(lambda session: _what_to_keep(session, now))
        jobs, commands = await self._delete_jobs(cutoff, keep)
        events = await self._delete_events(cutoff)
        comparisons = await self._delete_job_comparisons(now - timedelta(seconds=self.settings.job_comparison_max_age))
        timings = await self._delete_job_timings(now - timedelta(seconds=self.settings.job_timing_max_age))
        report = RetentionReport(
            benchmark_jobs=jobs,
            commands=commands,
            events=events,
            drift_checks=drift_checks,
            job_comparisons=comparisons,
            job_timings=timings,
        )
        if self.metrics is not None:
            for kind in ("benchmark_jobs", "commands", "events", "drift_checks", "job_comparisons", "job_timings"):
                self.metrics.retention_deleted.labels(kind=kind).inc(getattr(report, kind))
        if jobs or events or drift_checks:
            logger.info(
                "retention deleted %d benchmark jobs (%d commands), %d events, %d drift checks older than %s",
                jobs,
                commands,
                events,
                drift_checks,
                cutoff.isoformat(),
            )
        if comparisons:
            logger.info("retention deleted %d job comparisons", comparisons)
        if timings:
            logger.info("retention deleted %d timing records of learning jobs", timings)
        return report

    async def _delete_drift_checks(self, cutoff: datetime) -> int:
        return await self._delete_older(DriftCheckRow, cutoff, DriftCheckRow.status != _RUNNING)

    async def _delete_events(self, cutoff: datetime) -> int:
        def batch(session: Session) -> int:
            ids = session.scalars(
                sa.select(EventRow.id).where(EventRow.at < cutoff).order_by(EventRow.id).limit(self.settings.batch_size)
            ).all()
            if ids:
                session.execute(sa.delete(EventRow).where(EventRow.id.in_(ids)))
            return len(ids)

        return await self._until_done(batch)

    async def _delete_job_comparisons(self, cutoff: datetime) -> int:
        return await self._delete_older(JobComparisonRow, cutoff)

    async def _delete_job_timings(self, cutoff: datetime) -> int:
        """Whole jobs' timing records: those whose newest is older than ``cutoff``, then the oldest jobs' while
        more than ``job_timing_max_records`` are held."""
        rows = self.settings.batch_size

        def old(session: Session) -> tuple[int, bool]:
            return _timing_jobs_batch(session, older_than=cutoff, want=None, rows=rows)

        def excess(session: Session) -> tuple[int, bool]:
            held = session.scalar(sa.select(sa.func.count()).select_from(JobTimingRow)) or 0
            beyond = held - self.settings.job_timing_max_records
            return (0, False) if beyond <= 0 else _timing_jobs_batch(session, older_than=None, want=beyond, rows=rows)

        total = 0
        for batch in (old, excess):
            more = True
            while more:
                deleted, more = await self.db.run(batch)  # one transaction per batch
                total += deleted
        return total

    async def _delete_older(
        self, table: type[DriftCheckRow] | type[JobComparisonRow], cutoff: datetime, *also: sa.ColumnElement[bool]
    ) -> int:
        """Delete the rows of ``table`` created before ``cutoff`` (and matching ``also``), oldest first."""

        def batch(session: Session) -> int:
            ids = session.scalars(
                sa.select(table.id)
                .where(table.created_at < cutoff, *also)
                .order_by(table.created_at)
                .limit(self.settings.batch_size)
            ).all()
            if ids:
                session.execute(sa.delete(table).where(table.id.in_(ids)))
            return len(ids)

        return await self._until_done(batch)

    async def _until_done(self, batch: Callable[[Session], int]) -> int:
        total = 0
        while True:
            deleted = await self.db.run(batch)  # one transaction per batch
            total += deleted
            if deleted < self.settings.batch_size:
                return total

    async def _delete_jobs(self, cutoff: datetime, keep: _Keep) -> tuple[int, int]:
        """Delete ended jobs older than ``cutoff`` that ``keep`` does not hold, oldest first, in batches."""
        jobs = commands = 0
        after: tuple[datetime, str] | None = None
        while True:

            def batch(
                session: Session, after: tuple[datetime, str] | None = after
            ) -> tuple[int, int, tuple[datetime, str] | None]:
                query = (
                    sa.select(BenchmarkJobRow.id, BenchmarkJobRow.created_at, BenchmarkJobRow.nodes)
                    .where(BenchmarkJobRow.created_at < cutoff, BenchmarkJobRow.status != _RUNNING)
                    .order_by(BenchmarkJobRow.created_at, BenchmarkJobRow.id)
                    .limit(self.settings.batch_size)
                )
                if after is not None:  # keyset paging: the kept jobs are not read again
                    query = query.where(sa.tuple_(BenchmarkJobRow.created_at, BenchmarkJobRow.id) > after)
                page = [(r[0], r[1], list(r[2])) for r in session.execute(query)]
                doomed = [job_id for job_id, created_at, nodes in page if not keep.keeps((job_id, created_at, nodes))]
                deleted_commands = 0
                if doomed:  # a job and its commands go together or not at all
                    result = session.execute(sa.delete(CommandRow).where(CommandRow.job_id.in_(doomed)))
                    deleted_commands = int(result.rowcount or 0)  # type: ignore[attr-defined]
                    session.execute(sa.delete(BenchmarkJobRow).where(BenchmarkJobRow.id.in_(doomed)))
                last = (page[-1][1], page[-1][0]) if len(page) == self.settings.batch_size else None
                return len(doomed), deleted_commands, last

            deleted_jobs, deleted_commands, after = await self.db.run(batch)
            jobs += deleted_jobs
            commands += deleted_commands
            if after is None:
                return jobs, commands


def _what_to_keep(session: Session, now: datetime) -> _Keep:
    job_ids: set[str] = set()
    for rollout_id, wave, attempt, samples in session.execute(
        sa.select(GateResultRow.rollout_id, GateResultRow.wave, GateResultRow.attempt, GateResultRow.samples)
    ):
        job_ids.update(
            gate_job_id(rollout_id, wave=wave, attempt=attempt, repeat=int(s["repeat"]), arm=str(s["arm"]))
            for s in samples
        )
    for (drift_jobs,) in session.execute(sa.select(DriftCheckRow.job_ids)):
        job_ids.update(drift_jobs)
    windows = tuple(
        (created_at, finished_at or now, frozenset(nodes))
        for created_at, finished_at, nodes in session.execute(
            sa.select(StudyRow.created_at, StudyRow.finished_at, StudyRow.nodes).where(StudyRow.result == "promoted")
        )
    )
    return _Keep(frozenset(job_ids), windows)


def _timing_jobs_batch(
    session: Session, *, older_than: datetime | None, want: int | None, rows: int
) -> tuple[int, bool]:
    """Delete the oldest jobs' timing records (by their newest; only those older than ``older_than``, if given),
    whole jobs of at most ``rows`` records together (at least one job), stopping once ``want`` are deleted;
    the records deleted, and whether more jobs matched."""
    newest = sa.func.max(JobTimingRow.created_at)
    query = sa.select(JobTimingRow.job_id, sa.func.count()).group_by(JobTimingRow.job_id)
    if older_than is not None:
        query = query.having(newest < older_than)
    page = list(session.execute(query.order_by(newest, JobTimingRow.job_id).limit(rows)))
    doomed: list[str] = []
    deleted = 0
    for job_id, count in page:
        if doomed and (deleted + count > rows or (want is not None and deleted >= want)):
            break
        doomed.append(job_id)
        deleted += count
    if doomed:
        session.execute(sa.delete(JobTimingRow).where(JobTimingRow.job_id.in_(doomed)))
    return deleted, len(doomed) < len(page) or len(page) == rows
