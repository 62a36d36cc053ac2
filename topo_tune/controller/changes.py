"""Wake-ups per record: a service says "this one changed" right after it commits, and whoever waits wakes.

The state lives in the database; a wake-up carries none. A waiter takes the record's signal *before* it
reads the state, so a change committed between that read and its wait still wakes it: no change is missed
and nothing is polled. ``follow`` is that loop, for waiters (``BenchmarkJobs.wait``) and the admin API's
watch streams alike. ``close`` wakes every waiter there is with `WatchEnded` (the controller stops leading or
shuts down: a client watches again wherever the leader now is). A wake-up with nothing changed is harmless
(the waiter reads the same state again), so one `Changes` may serve records of several kinds.

Non-goals: carrying data, and wake-ups across processes (only the leader runs jobs and serves the admin API).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

from topo_tune.errors import WatchEnded

T = TypeVar("T")


class Changes:
    """One signal per record id, alive while someone waits on it."""

    def __init__(self) -> None:
        self._signals: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        self._ended: weakref.WeakKeyDictionary[asyncio.Event, str] = weakref.WeakKeyDictionary()

    def signal(self, key: str) -> asyncio.Event:
        """The event the next ``changed(key)`` sets; take it before reading the state."""
        event = self._signals.get(key)
        if event is None:
            event = asyncio.Event()
            self._signals[key] = event
        return event

    def changed(self, key: str) -> None:
        """Wake whoever waits on ``key`` (call after the change is committed)."""
        event = self._signals.pop(key, None)
        if event is not None:
            event.set()

    def close(self, why: str) -> None:
        """Wake every waiter there is now with `WatchEnded` saying ``why``."""
        for key in list(self._signals):
            event = self._signals.pop(key, None)
            if event is not None:
                self._ended[event] = why
                event.set()

    async def follow(self, key: str, read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> AsyncIterator[T]:
        """``read()`` now and after every change of ``key``, until ``done`` of what it read (yielded last)."""
        while True:
            signal = self.signal(key)
            state = await read()
            yield state
            if done(state):
                return
            await signal.wait()
            why = self._ended.get(signal)
            if why is not None:
                raise WatchEnded(why)

    async def last(self, key: str, read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
        """What ``read()`` gives once ``done``: waits for the change that ends it."""
        async for state in self.follow(key, read, done):
            if done(state):
                return state
        raise AssertionError("follow ends only after a state that is done")  # pragma: no cover


async def first_of(
    signals: Iterable[asyncio.Event], futures: Iterable[asyncio.Future[Any]], *, within_s: float
) -> None:
    """Return once one of ``signals`` is set or one of ``futures`` is done, or after ``within_s`` seconds."""
    woken = [asyncio.ensure_future(signal.wait()) for signal in signals]
    try:
        await asyncio.wait([*futures, *woken], timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for each in woken:
            each.cancel()
