"""Alembic environment: runs on the connection that ``Database.migrate`` hands over."""

from __future__ import annotations

from alembic import context

from topo_tune.controller.db.models import VERSION_TABLE, Base

connection = context.config.attributes["connection"]
# Optuna keeps its own schema in the same database with its own `alembic_version` table; ours is apart.
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,
    version_table=VERSION_TABLE,
)
with context.begin_transaction():
    context.run_migrations()
