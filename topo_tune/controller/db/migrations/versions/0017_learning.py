"""Learning from production jobs: a config version's kill switch, and the arm a learning job was pinned to.

Both are new columns: every version stored before learns nothing unless learning is switched on, and its kill
switch starts off; every pin stored before is a job that did not learn (no arm). Downgrading drops them.

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


def downgrade() -> None:
    with op.batch_alter_table("job_pins") as batch_op:
        batch_op.drop_column("learning_arm")
    with op.batch_alter_table("config_versions") as batch_op:
        batch_op.drop_column("learning_stopped")
