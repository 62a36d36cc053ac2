"""The leader fence: one row holding the epoch of the leader whose writes may commit.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "leader_epoch",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=253), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    # Seeded here, so a claim is always an UPDATE: two first leaders cannot race on an INSERT.
    op.bulk_insert(table, [{"id": 1, "epoch": -1, "holder": "", "claimed_at": None}])


def downgrade() -> None:
    op.drop_table("leader_epoch")
