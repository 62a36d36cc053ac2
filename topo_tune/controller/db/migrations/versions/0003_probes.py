"""Probes: rounds of pairwise node-to-node measurements and the measured pairs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "probe_rounds",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("message_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "pair_measurements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("round_id", sa.String(length=64), nullable=False),
        sa.Column("node_a", sa.String(length=253), nullable=False),
        sa.Column("node_b", sa.String(length=253), nullable=False),
        sa.Column("bandwidth_gbps", sa.Double(), nullable=False),
        sa.Column("latency_us", sa.Double(), nullable=False),
        sa.Column("method", sa.String(length=128), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["round_id"],
            ["probe_rounds.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("pair_measurements", schema=None) as batch_op:
        batch_op.create_index("ix_pair_measurements_pair", ["node_a", "node_b", "measured_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("pair_measurements", schema=None) as batch_op:
        batch_op.drop_index("ix_pair_measurements_pair")

    op.drop_table("pair_measurements")
    op.drop_table("probe_rounds")
