"""Drift checks; indexes that let retention walk events and benchmark jobs oldest first.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "drift_checks",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("config_version", sa.String(length=32), nullable=False),
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("wave", sa.Integer(), nullable=True),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("reference_busbw_gbps", sa.Double(), nullable=True),
        sa.Column("measured_busbw_gbps", sa.Double(), nullable=True),
        sa.Column("threshold", sa.Double(), nullable=True),
        sa.Column("job_ids", sa.JSON(), nullable=False),
        sa.Column("study_id", sa.String(length=64), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_drift_checks_created_at", "drift_checks", ["created_at"])
    op.create_index("ix_events_at", "events", ["at"])
    op.create_index("ix_benchmark_jobs_created_at", "benchmark_jobs", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_benchmark_jobs_created_at", table_name="benchmark_jobs")
    op.drop_index("ix_events_at", table_name="events")
    op.drop_index("ix_drift_checks_created_at", table_name="drift_checks")
    op.drop_table("drift_checks")
