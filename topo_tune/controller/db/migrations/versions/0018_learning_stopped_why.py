"""Learning's kill switch keeps why it was set (an admin, or a job whose ranks' records disagreed), and timing
records are indexed by age for retention.

Every version stored before keeps its switch with no reason (``""``). Downgrading drops both.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("config_versions") as batch_op:
        batch_op.add_column(sa.Column("learning_stopped_why", sa.String(1024), server_default="", nullable=False))
    op.create_index("ix_job_timings_created_at", "job_timings", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_job_timings_created_at", table_name="job_timings")
    with op.batch_alter_table("config_versions") as batch_op:
        batch_op.drop_column("learning_stopped_why")
