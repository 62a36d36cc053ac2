"""Group commit: writes arriving together share a transaction, each returns after its commit, one bad write
fails alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import EventRow
from topo_tune.controller.group_commit import GroupCommit


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Database]:
    database = Database(sqlite_url, retry_for_s=5)
    database.migrate()
    yield database
    database.close()


def _events(db: Database) -> list[str]:
    return db.transact(lambda s: list(s.scalars(sa.select(EventRow.message).order_by(EventRow.id))))


async def test_concurrent_writes_share_transactions_and_each_returns_after_its_commit(db: Database) -> None:
    transactions: list[int] = []

    def write(session: Session, items: Sequence[str]) -> list[int]:
        transactions.append(len(items))
        for item in items:
            session.add(EventRow(node_name="n", kind="test", message=item, at=datetime.now(UTC)))
        session.flush()
        return [len(item) for item in items]

    group: GroupCommit[str, int] = GroupCommit(db, write, max_batch=300)
    items = [f"item-{i}" for i in range(1000)]

    async def one(item: str) -> int:
        outcome = await group.submit(item)
        assert item in _events(db), "returned before its write was committed"
        return outcome

    outcomes = await asyncio.gather(*(one(item) for item in items))
    assert outcomes == [len(item) for item in items]
    assert sorted(_events(db)) == sorted(items), "every write once"
    assert sum(transactions) == 1000 and len(transactions) <= 6, transactions
    assert max(transactions) <= 300
    # A lone write is committed at once, not held for company.
    assert await asyncio.wait_for(group.submit("alone"), 5) == 5


async def test_a_bad_write_fails_alone(db: Database) -> None:
    def write(session: Session, items: Sequence[str]) -> list[None]:
        for item in items:
            if item == "bad":
                raise ValueError("refused: bad")
            session.add(EventRow(node_name="n", kind="test", message=item, at=datetime.now(UTC)))
        return [None] * len(items)

    group: GroupCommit[str, None] = GroupCommit(db, write)
    results = await asyncio.gather(*(group.submit(i) for i in ("a", "bad", "b")), return_exceptions=True)
    assert isinstance(results[1], ValueError)
    assert results[0] is None and results[2] is None
    assert sorted(_events(db)) == ["a", "b"]
