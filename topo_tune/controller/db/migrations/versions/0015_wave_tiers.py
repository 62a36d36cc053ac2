"""A rollout wave keeps the network tiers above its racks (the plan's group, e.g. a spine block).

Waves stored before have none (``[]``), as a plan over nodes without tier labels has. Downgrading drops them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollout_waves") as batch_op:
        batch_op.add_column(sa.Column("tiers", sa.JSON(), server_default="[]", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("rollout_waves") as batch_op:
        batch_op.drop_column("tiers")
