"""Learning from production jobs: a config version's kill switch, the arm a learning job was pinned to, and the
timing records learning jobs ship.

The first two are new columns: every version stored before has its kill switch off; every pin stored before is
a job that did not learn (no arm). The records are a new table. Downgrading drops all three.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("config_versions") as batch_op:
        batch_op.add_column(sa.Column("learning_stopped", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("job_pins") as batch_op:
        batch_op.add_column(sa.Column("learning_arm", sa.Integer(), nullable=True))
    op.create_table(
        "job_timings",
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("comm", sa.String(length=16), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("config_version", sa.String(length=32), nullable=False),
        sa.Column("arm", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("record", sa.Text(), nullable=False),
        sa.Column("owner", sa.String(length=16), server_default="", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "comm", "rank"),
    )
    op.create_index("ix_job_timings_version", "job_timings", ["config_version"])


def downgrade() -> None:
    op.drop_index("ix_job_timings_version", table_name="job_timings")
    op.drop_table("job_timings")
    with op.batch_alter_table("job_pins") as batch_op:
        batch_op.drop_column("learning_arm")
    with op.batch_alter_table("config_versions") as batch_op:
        batch_op.drop_column("learning_stopped")
