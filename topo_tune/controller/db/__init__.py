"""Persistence: typed SQLAlchemy models, the one session scope that owns commit/rollback, Alembic migrations."""
