"""Collectives and nccl-tests' bandwidth arithmetic (algbw, busbw factors).

The factors follow NVIDIA nccl-tests (``doc/PERFORMANCE.md`` and each test's ``*GetBw``): algbw is
``S / t`` with ``S`` the size nccl-tests prints for that test, and busbw multiplies it by a factor that
makes every test comparable to a link's bandwidth.

The busbw factors are the harness's own (``topo_tune.benchmark.collectives``), so simulated and measured
figures can never disagree on them.
"""

from __future__ import annotations

import enum

from topo_tune.benchmark.collectives import Collective as HarnessCollective
from topo_tune.benchmark.collectives import bus_factor as harness_bus_factor


class Collective(enum.Enum):
    """The collectives nccl-tests measures and topo-tune benchmarks."""

    # Members are singletons: an identity hash keeps the model's table lookups off Enum's slow __hash__.
    __hash__ = object.__hash__

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "alltoall"
    SENDRECV = "sendrecv"


def bus_factor(collective: Collective, nranks: int) -> float:
    """nccl-tests' busbw / algbw ratio for ``collective`` over ``nranks`` ranks."""
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, got {nranks}")
    return harness_bus_factor(HarnessCollective(collective.value), nranks)


def algbw_gbs(size_bytes: int, time_us: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes), as nccl-tests prints it."""
    return size_bytes / (time_us * 1e3) if time_us > 0 else 0.0


def busbw_gbs(collective: Collective, nranks: int, size_bytes: int, time_us: float) -> float:
    """Bus bandwidth in GB/s, as nccl-tests prints it."""
    return algbw_gbs(size_bytes, time_us) * bus_factor(collective, nranks)
