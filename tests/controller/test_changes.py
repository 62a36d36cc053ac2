"""Wake-ups per record: no change committed between a read and a wait is missed; close ends every wait."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tests.support.processes import TOKEN
from topo_tune.client.admin import AdminClient
from topo_tune.controller.changes import Changes
from topo_tune.controller.server import Controller
from topo_tune.errors import NotFoundError, WatchEnded


async def test_a_change_between_the_read_and_the_wait_still_wakes_the_waiter() -> None:
    changes, state = Changes(), {"job": "running"}
    reads = 0

    async def read() -> str:
        nonlocal reads
        reads += 1
        if reads == 1:
            state["job"] = "ended"  # committed right after this read, before the waiter waits
            changes.changed("job")
            return "running"
        return state["job"]

    assert await asyncio.wait_for(changes.last("job", read, lambda s: s == "ended"), 5) == "ended"
    assert reads == 2, "read once more after the change, not polled"


async def test_follow_yields_each_change_and_ends_with_the_final_state() -> None:
    changes, current = Changes(), "running 0/2"
    seen: asyncio.Queue[str] = asyncio.Queue()

    async def read() -> str:
        return current

    async def follow() -> list[str]:
        out = []
        async for state in changes.follow("j", read, lambda s: s.startswith("ended")):
            out.append(state)
            seen.put_nowait(state)
        return out

    task = asyncio.create_task(follow())
    for state in ("running 1/2", "ended 2/2"):
        await asyncio.wait_for(seen.get(), 5)  # the follower has read and waits again
        changes.changed("other")  # another record's change wakes nobody here
        current = state
        changes.changed("j")
    assert await asyncio.wait_for(task, 5) == ["running 0/2", "running 1/2", "ended 2/2"]


async def test_close_ends_every_wait_with_watch_ended_and_later_waits_work() -> None:
    changes = Changes()

    async def running() -> str:
        return "running"

    waits = [asyncio.create_task(changes.last(key, running, lambda s: False)) for key in ("a", "b")]
    await asyncio.sleep(0.01)
    changes.close("this controller is no longer the leader")
    for wait in waits:
        with pytest.raises(WatchEnded, match="no longer the leader"):
            await asyncio.wait_for(wait, 5)
    again = asyncio.create_task(changes.last("a", running, lambda s: False))
    await asyncio.sleep(0.01)
    assert not again.done(), "a wait begun after the close waits for a change"
    again.cancel()


async def test_signals_nobody_waits_for_are_not_kept() -> None:
    changes = Changes()
    changes.signal("gone")
    gc.collect()
    assert "gone" not in changes._signals


async def test_watching_an_unknown_job_is_not_found(controller: Controller) -> None:
    with (
        AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as client,
        pytest.raises(NotFoundError, match="no benchmark job with id 'bj-none'"),
    ):
        await asyncio.to_thread(client.wait_benchmark, "bj-none")
