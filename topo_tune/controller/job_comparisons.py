"""Jobs' own A/B comparisons as the controller keeps them: runs recorded by the nodes, figures once complete.

``exec --compare`` runs on every node of a job; the metric of a run is read on the node that is node rank 0
of that run, and the arms' orders may put a different node first, so one comparison's values can arrive from
more than one node. Each node records the runs it read; they land in one row (its id is derived from the job
id and the arms as named), and when the last run is in, the figures are computed here, from the stored values
and with the proof's statistics (``job_compare.summary``): a job reports what it measured, never its verdict.

A record is checked against the job's schedule (``job_compare.schedule``, derived again from the job id): a
run's pair and arm must be the ones the schedule gives its index, and its node must be node rank 0 of its
arm's order. Each arm's version and order must be the ones pinned for the job and that arm (``exec
--compare`` resolved them here): a job credential records only what this controller gave the job. The same
run recorded again with the same value is a no-op (a retry); with another value it is refused, as is a
record whose arms, metric, pairs or orders differ from what the first one said.

A comparison belongs to the job credential that recorded it first, and only the credential that owns the
job's pins may record it (``tenancy``); errors name the field or run that differs, never the stored value.

Non-goals: running the job (the CLI), who may record (``credentials``: a job credential may).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.orm import Session

from topo_tune.config.cluster import JobCapsConfig
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import JobComparisonRow
from topo_tune.controller.tenancy import ADMIN, CAPS, Tenant, check_row_nodes
from topo_tune.errors import AlreadyExists, ConflictError, StorageError, ValidationError
from topo_tune.jobs.compare.comparison_record import ComparisonHeader, StoredComparison
from topo_tune.jobs.compare.schedule import Arm, arm_schedule
from topo_tune.jobs.compare.summary import ComparisonSummary, RunValue, summarise
from topo_tune.jobs.config import JobPin
from topo_tune.tuner.statistics import Decision


def comparison_id(*, job_id: str, candidate: str, against: str) -> str:
    digest = hashlib.sha256(f"{job_id}\0{candidate}\0{against}".encode()).hexdigest()
    return f"jc-{digest[:16]}"


def _run_json(run: RunValue) -> dict[str, Any]:
    return {"index": run.index, "pair": run.pair, "arm": run.arm.value, "value": run.value, "node": run.node}


def _run(data: Mapping[str, Any]) -> RunValue:
    return RunValue(
        index=data["index"], pair=data["pair"], arm=Arm(data["arm"]), value=data["value"], node=data["node"]
    )


def _figures_json(figures: ComparisonSummary) -> dict[str, Any]:
    return {**asdict(figures), "decision": figures.decision.value}


def _figures(data: Mapping[str, Any] | None) -> ComparisonSummary | None:
    if data is None:
        return None
    return ComparisonSummary(**{**data, "decision": Decision(data["decision"])})


def _stored(row: JobComparisonRow) -> StoredComparison:
    return StoredComparison(
        id=row.id,
        header=ComparisonHeader.from_json(row.header),
        runs=tuple(_run(r) for r in row.runs),
        figures=_figures(row.figures),
        created_at=row.created_at,
        completed_at=row.completed_at,
    )


def check_runs(header: ComparisonHeader, runs: Sequence[RunValue]) -> None:
    """``ValidationError`` naming the run unless each fits the job's schedule and was read where it should be."""
    for name, order in (("candidate_order", header.candidate_order), ("against_order", header.against_order)):
        if sorted(order) != sorted(header.nodes):
            raise ValidationError(name, "must hold each of the job's nodes exactly once")
    schedule = arm_schedule(header.job_id, header.pairs)
    for position, run in enumerate(runs):
        field = f"runs[{position}]"
        if not 0 <= run.index < len(schedule):
            raise ValidationError(
                field, f"index {run.index} is outside the {len(schedule)} runs of {header.pairs} pairs"
            )
        planned = schedule[run.index]
        if (run.pair, run.arm) != (planned.pair, planned.arm):
            raise ValidationError(
                field,
                f"run {run.index} is pair {planned.pair}'s {planned.arm.value} run in job {header.job_id}'s "
                f"schedule, not pair {run.pair}'s {run.arm.value} run",
            )
        if not (math.isfinite(run.value) and run.value > 0):
            raise ValidationError(field, f"the metric must be finite and > 0, got {run.value!r}")
        first = header.order(run.arm)[0]
        if run.node != first:
            raise ValidationError(
                field, f"run {run.index} is read on node rank 0 of its arm ({first}), not {run.node!r}"
            )


def _merge(header: ComparisonHeader, row: JobComparisonRow, runs: Sequence[RunValue]) -> list[dict[str, Any]]:
    # The errors name the field or run, never the stored value: the caller learns only that it differs.
    stored = ComparisonHeader.from_json(row.header)
    for name in header.to_json():
        if getattr(stored, name) != getattr(header, name):
            raise ConflictError(
                f"job {header.job_id}'s comparison was recorded with another {name}: "
                "every node of the job must run the same exec --compare"
            )
    merged = {r["index"]: r for r in row.runs}
    for run in runs:
        known = merged.get(run.index)
        if known is not None and (known["value"], known["node"]) != (run.value, run.node):
            raise AlreadyExists(f"run {run.index} of job {header.job_id} is recorded already, with another value")
        merged[run.index] = _run_json(run)
    return [merged[index] for index in sorted(merged)]


PinLookup = Callable[[str, str], Awaitable[JobPin | None]]
"""(job id, arm as named) → the job's pin for that arm, or None."""
OwnerLookup = Callable[[str], Awaitable[str | None]]
"""job id → the owner of its pins (``tenancy``), or None when it has none."""


@dataclass
class JobComparisons:
    db: Database
    wall_clock: Callable[[], datetime]
    pins: PinLookup
    pin_owner: OwnerLookup
    caps: JobCapsConfig = CAPS

    async def _check_pins(self, header: ComparisonHeader) -> None:
        for side, name, version in (
            (Arm.CANDIDATE, header.candidate, header.candidate_version),
            (Arm.AGAINST, header.against, header.against_version),
        ):
            pin = await self.pins(header.job_id, name)
            if pin is None:
                raise ConflictError(
                    f"job {header.job_id} has no pinned config for arm {name}: a comparison is recorded by the "
                    "exec --compare that resolved its arms at this controller"
                )
            if pin.version != version:
                raise ValidationError(
                    f"{side.value}_version",
                    f"job {header.job_id}'s arm {name} is pinned to another version than {version or 'defaults'}",
                )
            if tuple(pin.order) != header.order(side):
                raise ValidationError(
                    f"{side.value}_order", f"job {header.job_id}'s arm {name} is pinned to another node order"
                )

    async def record(
        self, header: ComparisonHeader, runs: Sequence[RunValue], *, tenant: Tenant = ADMIN
    ) -> StoredComparison:
        """Add one node's runs to the job's comparison; the figures once every run is in. Refused, with nothing
        stored, for a job or comparison that is not ``tenant``'s, or past its cap (``tenancy``)."""
        check_row_nodes(self.caps, header.nodes, "nodes")
        tenant.check_job(header.job_id)
        tenant.check_owner(header.job_id, await self.pin_owner(header.job_id))
        check_runs(header, runs)
        await self._check_pins(header)
        key = comparison_id(job_id=header.job_id, candidate=header.candidate, against=header.against)
        now = self.wall_clock()

        def write(session: Session) -> StoredComparison:
            row = session.get(JobComparisonRow, key, with_for_update=True)
            tenant.check_owner(header.job_id, None if row is None else row.owner)
            if row is None:
                owned = (
                    sa.select(sa.func.count())
                    .select_from(JobComparisonRow)
                    .where(JobComparisonRow.owner == tenant.owner)
                )
                tenant.check_count(session.scalar(owned) or 0, self.caps.comparisons_per_credential, "comparisons")
                row = JobComparisonRow(
                    id=key,
                    job_id=header.job_id,
                    owner=tenant.owner,
                    header=header.to_json(),
                    runs=[],
                    figures=None,
                    created_at=now,
                )
                session.add(row)
            merged = _merge(header, row, runs)
            if row.figures is None and len(merged) == 2 * header.pairs:
                figures = summarise([_run(r) for r in merged], higher_is_better=header.higher_is_better)
                row.figures = _figures_json(figures)
                row.completed_at = now
            row.runs = merged
            session.flush()
            return _stored(row)

        try:
            return await self.db.run(write)
        except StorageError as error:
            if not isinstance(error.__cause__, exc.IntegrityError):
                raise
            # Two nodes created the row at once (PostgreSQL); it exists now, and the retry locks it.
            return await self.db.run(write)

    async def list(
        self, *, job_id: str = "", limit: int = 50, after: tuple[datetime, str] | None = None
    ) -> list[StoredComparison]:
        """Newest first; one job's when ``job_id`` is given; those listed after ``after`` (created, id)."""

        def read(session: Session) -> list[StoredComparison]:
            order = (JobComparisonRow.created_at.desc(), JobComparisonRow.id.desc())
            query = sa.select(JobComparisonRow).order_by(*order)
            if job_id:
                query = query.where(JobComparisonRow.job_id == job_id)
            if after is not None:  # keyset paging: the next page starts where the last one ended
                query = query.where(sa.tuple_(JobComparisonRow.created_at, JobComparisonRow.id) < after)
            return [_stored(row) for row in session.scalars(query.limit(limit))]

        return await self.db.run(read)
