"""A benchmark job stored in domain terms: its spec and outcome as JSON, no longer wire messages.

``spec`` held the ``RunBenchmark`` every node was sent (each node's command keeps it); it now holds the job's
``BenchmarkSpec``. ``result`` held a serialised admin API ``BenchmarkJob``; its aggregated rows, missing and
hung ranks and simulated flag move into ``outcome`` (the rest of it copied the job's columns and spec).
Downgrading builds both messages again (a sim job's ``RunBenchmark`` without its simulated cluster, which only
the nodes read).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import hashlib
from typing import Any

import sqlalchemy as sa
from alembic import op

from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.v1 import admin_pb2, agent_pb2
from topo_tune.wire.benchmark import spec_from_proto, spec_to_proto

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_SIZE_FIELDS = ("bytes", "count", "in_place", "time_us", "algbw_gbps", "busbw_gbps", "wrong", "checked")
_SPREAD_FIELDS = ("p50_us", "p99_us", "cv")
_STATUS = {
    "running": admin_pb2.BENCHMARK_JOB_STATUS_RUNNING,
    "succeeded": admin_pb2.BENCHMARK_JOB_STATUS_SUCCEEDED,
    "failed": admin_pb2.BENCHMARK_JOB_STATUS_FAILED,
    "timed_out": admin_pb2.BENCHMARK_JOB_STATUS_TIMED_OUT,
}
_BACKEND = {"nccl": agent_pb2.BACKEND_NCCL, "gloo": agent_pb2.BACKEND_GLOO, "sim": agent_pb2.BACKEND_SIM}

jobs = sa.table(
    "benchmark_jobs",
    sa.column("id", sa.String),
    sa.column("status", sa.String),
    sa.column("message", sa.Text),
    sa.column("backend", sa.String),
    sa.column("nodes", sa.JSON),
    sa.column("spec", sa.LargeBinary),
    sa.column("spec_json", sa.JSON),
    sa.column("result", sa.LargeBinary),
    sa.column("outcome", sa.JSON),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("finished_at", sa.DateTime(timezone=True)),
)


def _size_json(row: agent_pb2.SizeResult) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(row, name) for name in (*_SIZE_FIELDS, *_SPREAD_FIELDS)}
    choice = row.choice
    data["choice"] = (
        {"offered": list(choice.offered), "nccl": choice.nccl, "applied": choice.applied, "channels": choice.channels}
        if row.HasField("choice")
        else None
    )
    return data


def _size_proto(data: dict[str, Any]) -> agent_pb2.SizeResult:
    row = agent_pb2.SizeResult(**{name: data[name] for name in (*_SIZE_FIELDS, *_SPREAD_FIELDS)})
    if data.get("choice"):
        row.choice.CopyFrom(agent_pb2.NcclChoice(**data["choice"]))
    return row


def upgrade() -> None:
    with op.batch_alter_table("benchmark_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("outcome", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("spec_json", sa.JSON(), nullable=True))
    connection = op.get_bind()
    for job_id, spec in connection.execute(sa.select(jobs.c.id, jobs.c.spec)).all():
        as_json = spec_from_proto(agent_pb2.RunBenchmark.FromString(spec)).to_json()
        connection.execute(sa.update(jobs).where(jobs.c.id == job_id).values(spec_json=as_json))
    for job_id, result in connection.execute(sa.select(jobs.c.id, jobs.c.result).where(jobs.c.result.is_not(None))):
        old = admin_pb2.BenchmarkJob.FromString(result)
        outcome = {
            "sizes": [_size_json(row) for row in old.sizes],
            "missing_ranks": list(old.missing_ranks),
            "hung_ranks": list(old.hung_ranks),
            "simulated": old.simulated,
        }
        connection.execute(sa.update(jobs).where(jobs.c.id == job_id).values(outcome=outcome))
    with op.batch_alter_table("benchmark_jobs", schema=None) as batch_op:
        batch_op.drop_column("result")
        batch_op.drop_column("spec")
    with op.batch_alter_table("benchmark_jobs", schema=None) as batch_op:
        batch_op.alter_column("spec_json", new_column_name="spec", existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("benchmark_jobs", schema=None) as batch_op:
        batch_op.alter_column("spec", new_column_name="spec_json", existing_type=sa.JSON(), nullable=True)
    with op.batch_alter_table("benchmark_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("result", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("spec", sa.LargeBinary(), nullable=True))
    connection = op.get_bind()
    for job_id, spec_json in connection.execute(sa.select(jobs.c.id, jobs.c.spec_json)).all():
        sent = spec_to_proto(BenchmarkSpec.from_json(spec_json)).SerializeToString()
        connection.execute(sa.update(jobs).where(jobs.c.id == job_id).values(spec=sent))
    query = sa.select(jobs).where(jobs.c.outcome.is_not(None))
    for row in connection.execute(query).mappings().all():
        run = agent_pb2.RunBenchmark.FromString(row["spec"])
        outcome = row["outcome"]
        old = admin_pb2.BenchmarkJob(
            job_id=row["id"],
            status=_STATUS[row["status"]],
            message=row["message"],
            collective=run.collective,
            nodes=list(row["nodes"]),
            world_size=run.world_size,
            dtype=run.dtype,
            env=dict(run.env),
            sizes=[_size_proto(s) for s in outcome["sizes"]],
            missing_ranks=outcome["missing_ranks"],
            hung_ranks=outcome["hung_ranks"],
            simulated=outcome["simulated"],
            backend=_BACKEND.get(row["backend"], agent_pb2.BACKEND_UNSPECIFIED),
            sizes_requested=run.sizes,
            iters=run.iters,
            warmup_iters=run.warmup_iters,
            cuda_graph=run.cuda_graph,
            tuner_table_sha256=hashlib.sha256(run.tuner_table.encode()).hexdigest() if run.tuner_table else "",
        )
        old.created_at.FromDatetime(row["created_at"])
        if row["finished_at"] is not None:
            old.finished_at.FromDatetime(row["finished_at"])
        connection.execute(sa.update(jobs).where(jobs.c.id == row["id"]).values(result=old.SerializeToString()))
    with op.batch_alter_table("benchmark_jobs", schema=None) as batch_op:
        batch_op.drop_column("outcome")
        batch_op.drop_column("spec_json")
        batch_op.alter_column("spec", existing_type=sa.LargeBinary(), nullable=False)
