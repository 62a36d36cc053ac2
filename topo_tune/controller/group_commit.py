"""Group commit: writes that arrive together share one transaction; each caller resumes after its commit.

Purpose: thousands of agents acknowledging a fan-out at once would otherwise cost one database commit each
(milliseconds apiece, one after another). A `GroupCommit` runs at most one transaction at a time; whatever
callers submitted meanwhile goes into the next one, so a quiet controller commits each write at once and a
busy one in batches, with no timer. A caller's ``submit`` returns only after the transaction holding its
item committed, so nothing is acknowledged that is not stored. When a batch's transaction fails, its items
are retried one transaction each, so one bad item fails alone.
Non-goals: ordering between different `GroupCommit` instances.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy.orm import Session

from topo_tune.controller.db.database import Database

logger = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - item
O = TypeVar("O")  # noqa: E741 - outcome


@dataclass
class GroupCommit(Generic[I, O]):
    """``write(session, items)`` returns one outcome per item, in order, inside one transaction."""

    db: Database
    write: Callable[[Session, Sequence[I]], list[O]]
    max_batch: int = 1000
    _pending: list[tuple[I, asyncio.Future[O]]] = field(default_factory=list, init=False)
    _flusher: asyncio.Task[None] | None = field(default=None, init=False)

    async def submit(self, item: I) -> O:
        future: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the callers woken by the same event submit theirs too
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            items = [item for item, _ in batch]
            try:
                outcomes = await self.db.run(functools.partial(self._write, items))
            except Exception as error:
                if len(batch) > 1:
                    logger.warning("a grouped transaction failed; its %d writes are retried one by one", len(batch))
                    await self._one_by_one(batch)
                elif not batch[0][1].done():
                    batch[0][1].set_exception(error)
                continue
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(outcome)

    def _write(self, items: Sequence[I], session: Session) -> list[O]:
        return self.write(session, items)

    async def _one_by_one(self, batch: list[tuple[I, asyncio.Future[O]]]) -> None:
        for item, future in batch:
            try:
                (outcome,) = await self.db.run(functools.partial(self._write, [item]))
            except Exception as error:
                if not future.done():
                    future.set_exception(error)
            else:
                if not future.done():
                    future.set_result(outcome)
