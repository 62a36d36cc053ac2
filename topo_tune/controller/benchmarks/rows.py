"""A benchmark job as stored: its row read as the domain job, and which nodes stored jobs still hold.

Non-goals: writing rows (``service.py`` does, in its transactions) and the wire (``controller/api/``).
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.benchmark.job_record import BenchmarkJob, JobOutcome, JobStatus, SizeRange
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.command_record import CommandStatus
from topo_tune.controller.db.models import BenchmarkJobRow, CommandRow
from topo_tune.ids import JobId
from topo_tune.nccl.backends import Backend
from topo_tune.v1 import agent_pb2

RUNNING = JobStatus.RUNNING.value


def ending(session: Session, nodes: list[str]) -> tuple[str, str] | None:
    """A (node, job) pair if one of ``nodes`` has a cancel that is not final."""
    query = (
        sa.select(CommandRow.node_name, CommandRow.body)
        .where(
            CommandRow.kind == "cancel_job",
            CommandRow.node_name.in_(nodes),
            CommandRow.status.in_([s.value for s in CommandStatus if not s.final]),
        )
        .limit(1)
    )
    row = session.execute(query).first()
    return (row[0], agent_pb2.Command.FromString(row[1]).cancel_job.job_id) if row is not None else None


def busy(session: Session, nodes: list[str]) -> tuple[str, str] | None:
    """A (node, job) pair if one of ``nodes`` is in a running job."""
    for job in session.scalars(sa.select(BenchmarkJobRow).where(BenchmarkJobRow.status == RUNNING)):
        overlap = sorted(set(job.nodes) & set(nodes))
        if overlap:
            return overlap[0], job.id
    return None


def tuner_table_sha256(table: str) -> str:
    """The digest a job's candidate table is known by ("" for none): the same hex the ranks record for the
    table file they loaded, so a job view and its ranks' settings can be matched."""
    return hashlib.sha256(table.encode()).hexdigest() if table else ""


def job_view(job: BenchmarkJobRow) -> BenchmarkJob:
    spec = BenchmarkSpec.from_json(job.spec)
    outcome = JobOutcome.from_json(job.outcome) if job.outcome is not None else JobOutcome()
    sweep = spec.sweep
    return BenchmarkJob(
        job_id=JobId(job.id),
        status=JobStatus(job.status),
        message=job.message,
        collective=spec.collective,
        nodes=tuple(job.nodes),
        world_size=spec.world_size,
        dtype=spec.dtype.name,
        env=dict(spec.env),
        backend=job.backend,
        sizes_requested=SizeRange(sweep.min_bytes, sweep.max_bytes, sweep.step_factor),
        iters=spec.iters,
        warmup_iters=spec.warmup_iters,
        cuda_graph=spec.cuda_graph,
        tuner_table_sha256=tuner_table_sha256(spec.tuner_table),
        created_at=job.created_at,
        simulated=outcome.simulated or Backend(job.backend).simulated,
        sizes=outcome.sizes,
        missing_ranks=outcome.missing_ranks,
        hung_ranks=outcome.hung_ranks,
        finished_at=job.finished_at,
    )
