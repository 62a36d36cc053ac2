"""Sparse probe rounds: a round's sampling policy and its progress (pairs planned, rounds, findings).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("probe_rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sampling", sa.String(length=16), server_default="full", nullable=False))
        batch_op.add_column(sa.Column("progress", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("probe_rounds", schema=None) as batch_op:
        batch_op.drop_column("progress")
        batch_op.drop_column("sampling")
