"""The database handle: engine set-up per backend, schema migration, and the one session scope.

SQLite (the embedded default) runs in WAL mode with a busy timeout; one worker thread does all of its
writing, so the controller never fights itself for SQLite's single write lock. Reads (``read``) run on
threads of their own, so a write that waits (a database that went away, a lock) never holds up a read.
PostgreSQL (production) gets a small pool with pre-ping. A database that goes away (restart, failover) is
retried with exponential backoff, a write for up to ``retry_for_s``, and so is a read, except one made while
answering an RPC (``answering_a_caller``): a few seconds, so the caller hears "database unavailable" before its
deadline; only when that runs out does the caller see ``StorageError``. A full disk is no transient
failure: the write fails at once with ``DatabaseFull``, naming the database, while reads go on.

Every state change goes through ``session_scope``: it commits when the block ends, rolls back on any
error, and never leaves a half-written change behind. A leader under leader election claims its epoch
(``claim_epoch``); from then on every commit first passes the fence's guard (``fence.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig
from sqlalchemy import event, exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from topo_tune.controller.db import fence
from topo_tune.errors import ConfigError, DatabaseFull, StorageError
from topo_tune.security.private_files import private_sqlite

logger = logging.getLogger(__name__)

T = TypeVar("T")
_ANSWERING = contextvars.ContextVar("answering_a_caller", default=False)


@contextmanager
def answering_a_caller() -> Iterator[None]:
    """Reads made inside this block (an RPC's handler) give up after ``read_retry_for_s``, not ``retry_for_s``."""
    token = _ANSWERING.set(True)
    try:
        yield
    finally:
        _ANSWERING.reset(token)


def table_of(entity: type[DeclarativeBase]) -> sa.Table:
    """The Core table of a mapped class: for executemany statements that need no per-row ORM bookkeeping."""
    return entity.metadata.tables[entity.__tablename__]


_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"


def first_line(error: BaseException) -> str:
    """An error's text up to its first line break: drivers add lines of their own (PostgreSQL's
    ``HINT:  Check free disk space.``, SQLAlchemy's SQL and background link)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def is_disk_full(error: BaseException) -> bool:
    """SQLite's SQLITE_FULL or PostgreSQL's disk_full, or an error raised from one (Optuna's storage wraps
    them): retrying cannot help until someone frees space."""
    if isinstance(error, DatabaseFull):
        return True
    if not isinstance(error, exc.DBAPIError):
        cause = error.__cause__ or error.__context__
        return cause is not None and cause is not error and is_disk_full(cause)
    driver = error.orig
    if getattr(driver, "sqlite_errorcode", None) == _SQLITE_FULL:
        return True
    if getattr(driver, "sqlstate", None) == _PG_DISK_FULL:
        return True
    # Drivers that carry no code: the messages SQLite and the kernel give.
    text = str(driver)
    return "database or disk is full" in text or "No space left on device" in text


def _is_transient(error: BaseException) -> bool:
    """Connection-level failures worth a retry: the server restarted, the socket broke, SQLite was busy.

    A full disk is not one of them, although SQLite reports it as an ``OperationalError`` too.
    """
    if is_disk_full(error):
        return False
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, exc.OperationalError | exc.InterfaceError | exc.DisconnectionError)


def _make_parent(database: str | None) -> None:
    """A SQLite file's directory, made if missing: SQLite cannot, and a missing directory never heals by retrying."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    directory = Path(database).parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError("--database", f"cannot create {directory}: {error.strerror or error}") from None


class Database:
    """One database URL, migrated to the current schema."""

    def __init__(self, url: str, *, retry_for_s: float = 60.0, read_retry_for_s: float = 3.0) -> None:
        try:
            parsed = sa.make_url(url)
        except exc.ArgumentError:
            raise ConfigError("--database", f"not a database URL: {url!r}") from None
        self.url = parsed
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite:
            _make_parent(parsed.database)
        self._retry_for_s = retry_for_s
        self._read_retry_for_s = min(read_retry_for_s, retry_for_s)
        self.engine = self._create_engine()
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._executor = ThreadPoolExecutor(max_workers=1 if self.is_sqlite else 4, thread_name_prefix="topo-tune-db")
        # Reads never queue behind the writer: WAL lets SQLite readers run while a write is open.
        # (An in-memory SQLite database is one per connection: its reads stay on the writer's thread.)
        in_memory = self.is_sqlite and parsed.database in (None, "", ":memory:")
        self._readers = (
            self._executor if in_memory else ThreadPoolExecutor(max_workers=4, thread_name_prefix="topo-tune-db-read")
        )
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

    @property
    def name(self) -> str:
        """The database as a message names it: SQLite's file, or the server's URL without its password."""
        if self.is_sqlite:
            return self.url.database or ":memory:"
        return self.url.render_as_string(hide_password=True)

    def _retrying(self, *, for_s: float | None = None) -> Retrying:
        return Retrying(
            retry=retry_if_exception(_is_transient),
            wait=wait_exponential(multiplier=0.1, max=5.0),
            stop=stop_after_delay(self._retry_for_s if for_s is None else for_s),
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

    def _transact(self, work: Callable[[Session], T], *, guarded: bool, for_s: float | None = None) -> T:
        try:
            for attempt in self._retrying(for_s=for_s):
                with attempt, self._session_scope(guarded=guarded) as session:
                    return work(session)
        except exc.SQLAlchemyError as error:
            if is_disk_full(error):
                said = first_line(getattr(error, "orig", error))
                raise DatabaseFull(
                    f"database {self.name} is full: no space left on the disk under it; "
                    f"writes fail until space is freed ({said})"
                ) from error
            said = first_line(getattr(error, "orig", error))
            raise StorageError(f"database {self.name} is unavailable: {error.__class__.__name__}: {said}") from error
        raise AssertionError("unreachable: tenacity re-raises")  # pragma: no cover

    def read_only(self, work: Callable[[Session], T], *, for_s: float | None = None) -> T:
        """``transact`` for work that only reads: unfenced, retried for ``for_s`` (default ``retry_for_s``)."""
        return self._transact(work, guarded=False, for_s=for_s)

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

    async def read(self, work: Callable[[Session], T]) -> T:
        """``read_only`` on the reader threads: never queued behind a write; short while answering a caller."""
        for_s = self._read_retry_for_s if _ANSWERING.get() else None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, functools.partial(self.read_only, work, for_s=for_s))

    def wait_until_reachable(self, *, for_s: float, stop: threading.Event) -> bool:
        """Block until the database answers a query (True), ``for_s`` has passed or ``stop`` is set (False).

        For work that cannot retry its own statements (a study's Optuna storage) and resumes from what was
        committed once the database is back."""
        deadline, pause = time.monotonic() + for_s, 0.5
        while not stop.is_set():
            try:
                with self.engine.connect() as connection:
                    connection.execute(sa.text("SELECT 1"))
                return True
            except exc.SQLAlchemyError:
                if time.monotonic() + pause > deadline:
                    return False
            stop.wait(pause)
            pause = min(pause * 2, 5.0)
        return False

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        if self._readers is not self._executor:
            self._readers.shutdown(wait=True)
        self.engine.dispose()
