"""A job's pin holds its node order, and is kept per arm (the job's own, or one ``exec --compare`` names).

The primary key becomes (job_id, arm), so the table is rebuilt: a new table, the rows copied (arm "", the
order left empty: a pin made before orders is answered in the launcher's order, sorted names), the old one
dropped and the new one renamed. Downgrading keeps only the job's own pins.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_COPIED = "job_id, config_version, nodes, rollout_id, created_at"


def upgrade() -> None:
    op.create_table(
        "job_pins_new",
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("arm", sa.String(length=32), nullable=False, server_default=""),
        sa.Column("config_version", sa.String(length=32), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("node_order", sa.JSON(), nullable=False),
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "arm"),
    )
    op.execute(f"INSERT INTO job_pins_new ({_COPIED}, arm, node_order) SELECT {_COPIED}, '', '[]' FROM job_pins")
    op.drop_table("job_pins")
    op.rename_table("job_pins_new", "job_pins")


def downgrade() -> None:
    op.create_table(
        "job_pins_old",
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("config_version", sa.String(length=32), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.execute(f"INSERT INTO job_pins_old ({_COPIED}) SELECT {_COPIED} FROM job_pins WHERE arm = ''")
    op.drop_table("job_pins")
    op.rename_table("job_pins_old", "job_pins")
