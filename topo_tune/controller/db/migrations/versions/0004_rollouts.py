"""Rollouts: config versions, rollouts with their waves, node states, gate results, audit log, job pins.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "config_versions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("provenance", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "job_pins",
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("config_version", sa.String(length=32), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("config_version", sa.String(length=32), nullable=False),
        sa.Column("previous_version", sa.String(length=32), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("wave", sa.Integer(), nullable=False),
        sa.Column("gate_attempt", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("paused_from", sa.String(length=16), nullable=False),
        sa.Column("resume_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=253), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["config_version"], ["config_versions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.create_index("ix_rollouts_phase", ["phase"], unique=False)

    op.create_table(
        "gate_results",
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("wave", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("attempt", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("verdict", sa.JSON(), nullable=False),
        sa.Column("samples", sa.JSON(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["rollout_id"], ["rollouts.id"]),
        sa.PrimaryKeyConstraint("rollout_id", "wave", "attempt"),
    )
    op.create_table(
        "rollout_audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("subject", sa.String(length=300), nullable=False),
        sa.Column("before", sa.String(length=16), nullable=False),
        sa.Column("after", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=253), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["rollout_id"], ["rollouts.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("rollout_audit", schema=None) as batch_op:
        batch_op.create_index("ix_rollout_audit_rollout", ["rollout_id", "id"], unique=False)

    op.create_table(
        "rollout_nodes",
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("node_name", sa.String(length=253), nullable=False),
        sa.Column("wave", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["rollout_id"], ["rollouts.id"]),
        sa.PrimaryKeyConstraint("rollout_id", "node_name"),
    )
    op.create_table(
        "rollout_waves",
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("racks", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["rollout_id"], ["rollouts.id"]),
        sa.PrimaryKeyConstraint("rollout_id", "index"),
    )


def downgrade() -> None:
    op.drop_table("rollout_waves")
    op.drop_table("rollout_nodes")
    with op.batch_alter_table("rollout_audit", schema=None) as batch_op:
        batch_op.drop_index("ix_rollout_audit_rollout")
    op.drop_table("rollout_audit")
    op.drop_table("gate_results")
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.drop_index("ix_rollouts_phase")
    op.drop_table("rollouts")
    op.drop_table("job_pins")
    op.drop_table("config_versions")
