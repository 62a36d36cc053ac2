"""Drift checks keep their test: the p-value and the significance level it was judged at.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: checks stored before this revision were judged by the threshold alone.
    with op.batch_alter_table("drift_checks") as batch:
        batch.add_column(sa.Column("p_value", sa.Double(), nullable=True))
        batch.add_column(sa.Column("alpha", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drift_checks") as batch:
        batch.drop_column("alpha")
        batch.drop_column("p_value")
