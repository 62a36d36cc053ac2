"""The database handle: engine set-up per backend, schema migration, and the one session scope.

SQLite (the embedded default) runs in WAL mode with a busy timeout; one worker thread does all of its
writing, so the controller never fights itself for SQLite's single write lock. PostgreSQL (production) gets
a small pool with pre-ping. A database that goes away (restart, failover) is retried with exponential
backoff inside ``session_scope``; only when that runs out does the caller see ``StorageError``.

Every state change goes through ``session_scope``: it commits when the block ends, rolls back on any
error, and never leaves a half-written change behind. A leader under leader election claims its epoch
(``claim_epoch``); from then on every commit first passes the fence's guard (``fence.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar

import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig
from sqlalchemy import event, exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from topo_tune.controller.db import fence
from topo_tune.errors import ConfigError, StorageError
from topo_tune.private_files import private_sqlite

logger = logging.getLogger(__name__)

T = TypeVar("T")


def table_of(entity: type[DeclarativeBase]) -> sa.Table:
    """The Core table of a mapped class: for executemany statements that need no per-row ORM bookkeeping."""
    return entity.metadata.tables[entity.__tablename__]


def _is_transient(error: BaseException) -> bool:
    """Connection-level failures worth a retry: the server restarted, the socket broke, SQLite was busy."""
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, exc.OperationalError | exc.InterfaceError | exc.DisconnectionError)


class Database:
    """One database URL, migrated to the current schema."""

    def __init__(self, url: str, *, retry_for_s: float = 60.0) -> None:
        try:
            parsed = sa.make_url(url)
        except exc.ArgumentError:
            raise ConfigError("--database", f"not a database URL: {url!r}") from None
        self.url = parsed
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self._retry_for_s = retry_for_s
        self.engine = self._create_engine()
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._executor = ThreadPoolExecutor(max_workers=1 if self.is_sqlite else 4, thread_name_prefix="topo-tune-db")
        self._fence: fence.Fence | None = None

    def _create_engine(self) -> Engine:
        if self.is_sqlite:
            private_sqlite(self.url.database)  # 0600 before SQLite opens it; its WAL and SHM take its mode
            engine = sa.create_engine(self.url, connect_args={"timeout": 30, "check_same_thread": False})

            @event.listens_for(engine, "connect")
            def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
                cursor = dbapi_connection.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                # FULL: a committed transition survives power loss, not only a crash of the process.
                cursor.execute("PRAGMA synchronous=FULL")
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.execute("PRAGMA busy_timeout=30000")
                cursor.close()

            return engine
        return sa.create_engine(self.url, pool_pre_ping=True, pool_size=5, max_overflow=5)

    def migrate(self) -> None:
        """Bring the schema to the newest revision (idempotent)."""
        config = AlembicConfig()
        config.set_main_option("script_location", str(resources.files("topo_tune.controller.db") / "migrations"))
        config.attributes["connection_url"] = self.url
        for attempt in self._retrying():
            with attempt, self.engine.begin() as connection:
                config.attributes["connection"] = connection
                alembic_command.upgrade(config, "head")

    def _retrying(self) -> Retrying:
        return Retrying(
            retry=retry_if_exception(_is_transient),
            wait=wait_exponential(multiplier=0.1, max=5.0),
            stop=stop_after_delay(self._retry_for_s),
            before_sleep=lambda state: logger.warning(
                "database unavailable (%s); retrying", state.outcome.exception() if state.outcome else "?"
            ),
            reraise=True,
        )

    @contextmanager
    def session_scope(self) -> Iterator[Session]:
        """A session that commits at the end of the block and rolls back on any error."""
        with self._session_scope(guarded=True) as session:
            yield session

    @contextmanager
    def _session_scope(self, *, guarded: bool) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
            if guarded and self._fence is not None:
                session.flush()  # SQLite: the writes take the write lock before the guard reads the epoch
                fence.guard(session, self._fence)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def transact(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in one transaction, retrying it whole on transient failures."""
        return self._transact(work, guarded=True)

    def _transact(self, work: Callable[[Session], T], *, guarded: bool) -> T:
        try:
            for attempt in self._retrying():
                with attempt, self._session_scope(guarded=guarded) as session:
                    return work(session)
        except exc.SQLAlchemyError as error:
            raise StorageError(f"database error: {error.__class__.__name__}: {error}") from error
        raise AssertionError("unreachable: tenacity re-raises")  # pragma: no cover

    @property
    def epoch(self) -> int | None:
        """The epoch this database's commits are fenced to (None: not fenced, no leader election)."""
        return self._fence.epoch if self._fence else None

    @property
    def fence(self) -> fence.Fence | None:
        """The fence of this process's leader term: its epoch, holder and idle bound (None: not fenced)."""
        return self._fence

    def claim_epoch(self, epoch: int, *, holder: str, at: datetime, idle_timeout_s: float = 5.0) -> None:
        """Claim ``epoch`` for this process's leader term, then fence every later commit to it.

        ``FencedError`` when the database holds a higher epoch (the term is stale); the fence is left as it was.
        """
        # Unguarded: the claim moves the fence itself.
        self._transact(lambda session: fence.claim(session, epoch=epoch, holder=holder, at=at), guarded=False)
        self._fence = fence.Fence(epoch, holder, idle_timeout_s)
        logger.info("claimed leader epoch %d", epoch, extra={"holder": holder})

    async def run(self, work: Callable[[Session], T]) -> T:
        """``transact`` on the database thread(s), awaited from the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.transact, work)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.dispose()
