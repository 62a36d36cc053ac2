"""Keeps Python's full garbage collections from stopping a controller that holds thousands of sessions.

Each agent session holds about a hundred objects the cyclic collector tracks (gRPC call state, coroutines,
queues, locks). Python runs a full collection whenever the objects that survived younger collections reach a
quarter of the old generation, and a full collection walks every tracked object with the event loop stopped:
hundreds of milliseconds at 5,000 agents, seconds at 20,000, every few seconds under steady heartbeats.

Python's young collections are no better under steady heartbeats: they run when allocations outnumber
deallocations by 700, but every session's pending read (a coroutine, futures, an async-generator step) lives
until the next heartbeat, so each heartbeat frees an old set as it allocates a new one and the count hardly
moves while the young generation fills with the survivors. At 20,000 agents a young collection came every
few seconds over 50,000-135,000 objects, and the middle one after it over 130,000-170,000: 200-300 ms with the
event loop stopped, every five seconds.

`HeapKeeper.tick` (every second) therefore collects the two younger generations itself (a walk over one
second's survivors, a few milliseconds), then moves what has settled into the old generation to the
permanent one (`gc.freeze`), so that automatic collections walk only what is new since. Objects frozen are
still freed by reference counting when they die (most do, the pending reads included); garbage cycles among
them are not found by those collections: they are reclaimed (`gc.unfreeze`, one full collection,
`gc.freeze`) once the frozen set has grown by a quarter since the last reclaim, checked once per
`reclaim_interval_s`: one pause an hour at worst, not one every few seconds.

Freed memory is not always given back: a refused 15 MiB request is parsed, decoded and checked, about 60 MiB
for a moment, and glibc's allocator keeps such freed chunks in its heaps, so the controller's resident
memory grew by 400-900 MiB over a few batches of them and stayed there: glibc serves a large block from
``mmap`` (given back when freed) only above a threshold that it raises to the size of each such block freed,
so after the first, 15 MiB blocks came from its heaps. ``run`` therefore fixes that threshold at
``MMAP_THRESHOLD`` (1 MiB; fixing it also ends the raising), and a tick asks the allocator to return the free
pages of its heaps (``malloc_trim``: a few ms with little to give back) every ``trim_interval_s``, and at once
while the resident set is ``trim_growth_mib`` above its floor (what it was after a trim that gave back little:
the memory in use): what gRPC received in small buffers for a burst of refused requests (100-200 MiB) is given
back within a second of the burst, not up to an interval later, and memory that is really in use raises the
floor after one trim instead of being trimmed every second. 1,000 such refusals leave the resident set
within a few MiB of the start (``benchmarks/results/rejected-messages.md``).
Non-goals: tuning the collector's thresholds; objects that are freed by reference counting (most) are freed
at once whether frozen or not.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None on a C library without it (musl, macOS): nothing to give back then."""
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim if name else None  # type: ignore[assignment]
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM = _malloc_trim()
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Serve blocks of ``size`` bytes or more from ``mmap`` from now on, whatever was freed before (glibc only)."""
    name = ctypes.util.find_library("c")
    try:
        return bool(name) and ctypes.CDLL(name).mallopt(_M_MMAP_THRESHOLD, size) == 1
    except (OSError, AttributeError):
        return False


_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


def _resident_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * _PAGE_MIB


@dataclass
class HeapKeeper:
    freeze_at: int = 10_000
    """Tracked objects in the old generation that make a tick freeze them: walking fewer costs a few ms."""
    reclaim_interval_s: float = 3600.0
    trim_interval_s: float = 10.0
    """How often a tick gives freed memory back to the system."""
    trim_growth_mib: float = 32.0
    """How far above its floor the resident set makes the next tick trim, whatever the interval."""
    clock: Callable[[], float] = time.monotonic
    resident_mib: Callable[[], float] = _resident_mib
    """This process's resident set, MiB."""
    _trimmed_at: float = field(default=-math.inf, init=False)
    _floor_mib: float = field(default=math.inf, init=False)
    _frozen_after_reclaim: int = field(default=-1, init=False)
    _reclaimed_at: float = field(default=0.0, init=False)

    def tick(self) -> str:
        """Freeze the old generation if it has grown, or reclaim frozen garbage if due; returns what it did
        (``"reclaimed"``, ``"froze"`` or ``""``)."""
        if self._frozen_after_reclaim < 0:  # the first tick: what is frozen now is the baseline
            self._frozen_after_reclaim, self._reclaimed_at = gc.get_freeze_count(), self.clock()
        # At most once an interval: counting the frozen set walks all of it.
        if self.clock() - self._reclaimed_at >= self.reclaim_interval_s and self._due():
            started = time.perf_counter()
            gc.unfreeze()
            collected = gc.collect()
            gc.freeze()
            self._frozen_after_reclaim, self._reclaimed_at = gc.get_freeze_count(), self.clock()
            logger.info(
                "reclaimed %d unreachable objects among %d long-lived ones in %.0f ms",
                collected,
                self._frozen_after_reclaim,
                (time.perf_counter() - started) * 1000,
            )
            return "reclaimed"
        self._trim_if_due()
        gc.collect(1)  # one second's survivors; young garbage goes first, so only what is alive is frozen
        if len(gc.get_objects(generation=2)) >= self.freeze_at:
            gc.freeze()
            return "froze"
        return ""

    def _trim_if_due(self) -> bool:
        if _MALLOC_TRIM is None:
            return False
        before = self.resident_mib()
        above = before - self._floor_mib >= self.trim_growth_mib
        if not above and self.clock() - self._trimmed_at < self.trim_interval_s:
            return False
        self._trimmed_at = self.clock()
        _MALLOC_TRIM(0)
        after = self.resident_mib()
        given = before - after
        # Little given back: what is resident is in use, the floor from now on. Else it was freed memory.
        self._floor_mib = after if given < self.trim_growth_mib / 8 else min(self._floor_mib, after)
        if given >= 64:
            logger.info("gave %.0f MiB of freed memory back to the system", given)
        return True

    def _due(self) -> bool:
        self._reclaimed_at = self.clock()  # checked: the next check is an interval away
        return gc.get_freeze_count() >= 1.25 * max(self._frozen_after_reclaim, self.freeze_at)

    async def run(self, interval_s: float = 1.0) -> None:
        """Tick every ``interval_s`` until cancelled (the daemon's own process: it fixes the mmap threshold)."""
        fix_mmap_threshold()
        while True:
            await asyncio.sleep(interval_s)
            self.tick()
