"""Benchmark jobs: the jobs table, each command's job id, each node's benchmark address.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "benchmark_jobs",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("benchmark_jobs", schema=None) as batch_op:
        batch_op.create_index("ix_benchmark_jobs_status", ["status"], unique=False)

    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_id", sa.String(length=128), nullable=True))
        batch_op.create_index(batch_op.f("ix_commands_job_id"), ["job_id"], unique=False)

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("address", sa.String(length=255), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("address")

    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_commands_job_id"))
        batch_op.drop_column("job_id")

    with op.batch_alter_table("benchmark_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_benchmark_jobs_status")

    op.drop_table("benchmark_jobs")
