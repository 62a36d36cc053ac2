"""The heap keeper: settled objects leave the collector's walks, and frozen garbage cycles are still reclaimed."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest

from topo_tune.controller.heap import HeapKeeper


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.collect()
    yield
    gc.unfreeze()
    gc.collect()


def test_a_grown_old_generation_is_frozen_and_frozen_garbage_is_reclaimed_once_due() -> None:
    now = [0.0]
    keeper = HeapKeeper(freeze_at=10_000, reclaim_interval_s=3600.0, clock=lambda: now[0])
    keeper.tick()  # this test process's own heap: frozen or not, it is the baseline
    assert keeper.tick() == "", "nothing has grown since"
    settled = [Node() for _ in range(keeper.freeze_at)]
    gc.collect()  # survivors move to the old generation, as a long-lived session's objects do
    assert keeper.tick() == "froze"
    assert not gc.get_objects(generation=2), "the collector's full walks now skip the settled objects"
    assert gc.get_freeze_count() >= len(settled)

    dead = weakref.ref(settled[0])
    del settled  # garbage now, but frozen: no automatic collection finds these cycles
    gc.collect()
    assert dead() is not None
    now[0] = 3599.0
    assert keeper.tick() != "reclaimed", "a reclaim is a full pause: at most once an interval"
    now[0] = 3600.0
    assert keeper.tick() == "reclaimed"
    assert dead() is None, "frozen cycles that became garbage are freed by the reclaim"
    assert keeper.tick() != "reclaimed", "not an interval since"


def test_each_tick_walks_what_is_young_so_it_never_piles_up() -> None:
    keeper = HeapKeeper(freeze_at=10_000, reclaim_interval_s=3600.0)
    keeper.tick()
    gc.disable()  # as when deallocations keep pace with allocations: no automatic young collection comes
    try:
        pending = [Node() for _ in range(5_000)]  # what every session holds until its next heartbeat
        assert len(gc.get_objects(generation=0)) >= len(pending)
        keeper.tick()
        young = gc.get_objects(generation=0) + gc.get_objects(generation=1)
        assert len(young) < 100, "the pending objects were walked and moved on"
    finally:
        gc.enable()


def test_freed_memory_is_given_back_to_the_system_once_an_interval() -> None:
    now = [0.0]
    keeper = HeapKeeper(trim_interval_s=10.0, clock=lambda: now[0])
    assert keeper._trim_if_due(), "the first tick trims"
    now[0] = 9.9
    assert not keeper._trim_if_due()
    now[0] = 10.0
    assert keeper._trim_if_due()


def test_memory_freed_after_a_burst_is_given_back_at_the_next_tick_and_memory_in_use_is_not_trimmed_again() -> None:
    now, readings = [0.0], [200.0]  # the resident set, MiB: before a trim, then after it
    keeper = HeapKeeper(
        trim_interval_s=10.0,
        trim_growth_mib=32.0,
        clock=lambda: now[0],
        resident_mib=lambda: readings.pop(0) if len(readings) > 1 else readings[0],
    )

    def tick(at: float, *resident: float) -> bool:
        now[0], readings[:] = at, list(resident)
        return keeper._trim_if_due()

    assert tick(0.0, 200.0), "the first tick trims: 200 MiB is the floor"
    assert not tick(1.0, 231.0), "less than 32 MiB above the floor"
    assert tick(2.0, 290.0, 270.0), "a burst in flight: 90 MiB above the floor"
    assert tick(3.0, 300.0, 205.0), "the burst ended: what it freed is given back at the next tick"
    assert not tick(4.0, 205.0)
    assert tick(5.0, 260.0, 259.0), "sessions that stay: trimmed once, giving back little..."
    assert not tick(6.0, 260.0), "...so they are the new floor, not trimmed every second"
    assert tick(16.0, 260.0), "the interval still trims"


FREED_BLOCKS = """
import sys
from topo_tune.controller.heap import _resident_mib, fix_mmap_threshold
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
start = _resident_mib()
for _ in range(3):
    block = b"x" * (15 << 20)  # a refused request's size
    del block
    held = [b"y" * 100 for _ in range(1000)]  # small blocks allocated after it, as a server's are
print(round(_resident_mib() - start))
"""


@pytest.mark.parametrize(("threshold", "kept"), [("dynamic", 15), ("fixed", 0)])
def test_with_the_mmap_threshold_fixed_a_freed_15_mib_block_is_given_back_at_once(threshold: str, kept: int) -> None:
    # Its own process: the threshold is per process and this one's heap has a history.
    run = subprocess.run([sys.executable, "-c", FREED_BLOCKS, threshold], capture_output=True, text=True, check=True)
    assert abs(int(run.stdout) - kept) <= 2, f"{threshold}: {run.stdout} MiB kept"
