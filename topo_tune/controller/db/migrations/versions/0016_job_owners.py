"""Job pins and comparisons record the job credential that made them (their owner), indexed for its caps;
credentials record a job credential's scope (a job-id prefix; "" for any job id, and for every older row).

Rows stored before belong to the admin (``""``): the shared job credential that made them is retired, so no
job credential of today reads or extends them. Downgrading drops the owners.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_TABLES = ("job_pins", "job_comparisons")


def upgrade() -> None:
    with op.batch_alter_table("credentials") as batch_op:
        batch_op.add_column(sa.Column("scope", sa.String(253), server_default="", nullable=False))
    for table in _TABLES:
        with op.batch_alter_table(table) as batch_op:
            batch_op.add_column(sa.Column("owner", sa.String(16), server_default="", nullable=False))
            batch_op.create_index(f"ix_{table}_owner", ["owner"])


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_index(f"ix_{table}_owner")
            batch_op.drop_column("owner")
    with op.batch_alter_table("credentials") as batch_op:
        batch_op.drop_column("scope")
