"""Jobs' own A/B comparisons (``topo-tune exec --compare``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_comparisons",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("header", sa.JSON(), nullable=False),
        sa.Column("runs", sa.JSON(), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_comparisons_created_at", "job_comparisons", ["created_at"])
    op.create_index("ix_job_comparisons_job", "job_comparisons", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_comparisons_job", table_name="job_comparisons")
    op.drop_index("ix_job_comparisons_created_at", table_name="job_comparisons")
    op.drop_table("job_comparisons")
