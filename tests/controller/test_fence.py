"""The leader fence in the database: a stale leader's commit is refused, a successor's claim waits for an
in-flight one, a frozen leader cannot block its successor. Real SQLite and PostgreSQL, real threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

from tests.support.postgres import PostgresServer
from tests.support.waiting import wait_until
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import EventRow, LeaderEpochRow
from topo_tune.errors import FencedError

AT = datetime(2026, 11, 29, tzinfo=UTC)


def add_event(kind: str) -> Callable[[Session], None]:
    def work(session: Session) -> None:
        session.add(EventRow(node_name="n1", kind=kind, message="", command_id="", at=AT))

    return work


def event_kinds(db: Database) -> list[str]:
    return db.transact(lambda s: list(s.scalars(sa.select(EventRow.kind).order_by(EventRow.id))))


def stored_epoch(db: Database) -> tuple[int, str]:
    row = db.transact(lambda s: s.get_one(LeaderEpochRow, 1))
    return row.epoch, row.holder


def handles(url: str) -> Iterator[tuple[Database, Database]]:
    """Two controller processes' handles on one database: the old leader's and its successor's."""
    old, new = Database(url, retry_for_s=5), Database(url, retry_for_s=5)
    old.migrate()
    try:
        yield old, new
    finally:
        old.close()
        new.close()


@pytest.fixture
def two(database_url: str) -> Iterator[tuple[Database, Database]]:
    yield from handles(database_url)


def test_a_stale_leaders_transaction_is_refused_and_writes_nothing(two: tuple[Database, Database]) -> None:
    old, new = two
    old.claim_epoch(1, holder="a", at=AT)
    old.transact(add_event("while-leading"))
    new.claim_epoch(2, holder="b", at=AT)

    with pytest.raises(FencedError, match=r"led epoch 1, but the database is at epoch 2 \(claimed by b\)"):
        old.transact(add_event("after-the-takeover"))
    new.transact(add_event("successor"))

    assert event_kinds(new) == ["while-leading", "successor"]
    assert stored_epoch(new) == (2, "b")


def test_a_claim_never_lowers_the_epoch(two: tuple[Database, Database]) -> None:
    old, new = two
    assert stored_epoch(new) == (-1, ""), "migration 0008 seeds the row below any Lease's epoch"
    new.claim_epoch(5, holder="b", at=AT)
    with pytest.raises(FencedError, match="led epoch 4, but the database is at epoch 5"):
        old.claim_epoch(4, holder="a", at=AT)
    assert old.epoch is None, "a refused claim fences nothing"
    new.claim_epoch(5, holder="b", at=AT)  # the same tenure again (a lapsed in-process term resumed)
    assert stored_epoch(new) == (5, "b")


def test_without_leader_election_nothing_is_fenced(two: tuple[Database, Database]) -> None:
    """One replica, no claim: writes go through whatever the row says (e.g. left by an earlier HA setup)."""
    old, new = two
    old.claim_epoch(7, holder="a", at=AT)
    assert new.epoch is None
    new.transact(add_event("single-replica"))
    assert event_kinds(new) == ["single-replica"]


class Runner:
    """Runs a call in a thread and keeps what it returned or raised."""

    def __init__(self, call: Callable[[], Any], done: list[str], name: str) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                call()
                if name:
                    done.append(name)
            except BaseException as error:
                self.error = error

        self.thread = threading.Thread(target=run, name=name)
        self.thread.start()

    def join(self) -> BaseException | None:
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.error


def pause_after_the_guard(db: Database) -> tuple[threading.Event, threading.Event]:
    """The first guard of ``db`` (its ``FOR SHARE`` read) waits for ``proceed`` before the commit goes on."""
    guarded, proceed = threading.Event(), threading.Event()

    @event.listens_for(db.engine, "after_cursor_execute")
    def pause(*args: Any) -> None:
        if "FOR SHARE" in args[2] and not guarded.is_set():
            guarded.set()
            proceed.wait(30)

    return guarded, proceed


def waiting_on_a_lock(admin_url: str, statement: str) -> bool:
    engine = sa.create_engine(admin_url)
    try:
        with engine.connect() as connection:
            waiting = connection.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :q"),
                {"q": statement + "%"},
            ).scalar_one()
    finally:
        engine.dispose()
    return bool(waiting)


@pytest.fixture
def pg_two(postgres: PostgresServer) -> Iterator[tuple[Database, Database]]:
    yield from handles(postgres.new_database())


@pytest.mark.postgres
def test_a_successors_claim_waits_for_the_old_leaders_in_flight_commit(
    pg_two: tuple[Database, Database], postgres: PostgresServer
) -> None:
    old, new = pg_two
    old.claim_epoch(1, holder="a", at=AT)
    guarded, proceed = pause_after_the_guard(old)
    done: list[str] = []

    # Recorded as the COMMIT is sent, before the server can release the share lock: the claimer's thread can
    # only record its claim after that (a record made after transact() returns could come second even so).
    @event.listens_for(old.engine, "commit")
    def committing(*_: Any) -> None:
        done.append("committed")

    writer = Runner(lambda: old.transact(add_event("in-flight")), done, "")
    assert guarded.wait(30), "the old leader's transaction passed its guard"

    claimer = Runner(lambda: new.claim_epoch(2, holder="b", at=AT), done, "claimed")
    wait_until(lambda: waiting_on_a_lock(postgres.admin_url, "UPDATE leader_epoch"), what="the claim to wait")
    assert done == []
    proceed.set()

    assert writer.join() is None and claimer.join() is None
    assert done == ["committed", "claimed"], "the claim went through only after the commit"
    assert event_kinds(new) == ["in-flight"], "committed before the takeover: the successor loads it"
    assert stored_epoch(new) == (2, "b")


@pytest.mark.postgres
def test_a_leader_frozen_between_guard_and_commit_cannot_block_its_successor(
    pg_two: tuple[Database, Database],
) -> None:
    old, new = pg_two
    old.claim_epoch(1, holder="a", at=AT, idle_timeout_s=0.5)
    guarded, proceed = pause_after_the_guard(old)
    done: list[str] = []
    writer = Runner(lambda: old.transact(add_event("frozen")), done, "committed")
    assert guarded.wait(30)

    # The server disconnects the idle-in-transaction session after 0.5 s; the lock goes with it.
    new.claim_epoch(2, holder="b", at=AT)
    proceed.set()  # the frozen process resumes: its commit finds a dead connection, its retry the fence

    error = writer.join()
    assert isinstance(error, FencedError) and (error.ours, error.current) == (1, 2)
    assert done == []
    assert event_kinds(new) == []
