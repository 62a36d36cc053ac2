"""The ring-order optimizer: which order of nodes (or of a node's GPUs) makes the best NCCL ring.

Purpose: NCCL chains nodes into its rings in the order of their lowest global rank (NCCL_FACTS §2.1), so the rank
order a launcher uses *is* the inter-node ring. Given a symmetric bandwidth matrix and a latency matrix, find the
cyclic order that maximises the ring's bottleneck bandwidth and, among orders with that bottleneck, crosses
between racks the fewest times (when racks are given; with the tiers above the racks, such as spine blocks,
the crossings of the highest tier count first), then minimises the summed latency. The crossings come
before latency because a pair matrix models each node pair alone: a ring crossing the spine four times shows
the same bottleneck as one crossing it twice, yet its crossings share the spine's uplinks. Exact for up to
`EXACT_LIMIT` members (a Hamiltonian-cycle check over bitmasks for the bottleneck, then Held–Karp for
crossings and latency). Larger instances: a rack-aware construction (racks visited contiguously, so a ring
over R racks crosses the spine R times; each tier's groups contiguous likewise), then 2-opt and Or-opt under
a penalty for edges below the bottleneck target, with the target found by search from an upper bound downward.
Here ``optimize_ring`` picks the method; ``ring`` holds the ring and its measures, ``ring_exact`` and
``ring_heuristic`` the two methods.
Non-goals: trees, multi-ring (per-channel) plans, and launching anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from topo_tune.errors import RingOrderError
from topo_tune.tuner.ring.exact import EXACT_LIMIT, exact_ring
from topo_tune.tuner.ring.heuristic import heuristic_ring
from topo_tune.tuner.ring.model import Matrix, Ring, array_metrics, checked_arrays


def optimize_ring(
    bandwidth: Matrix,
    latency: Matrix | None = None,
    *,
    racks: Sequence[str] | None = None,
    tiers: Sequence[Sequence[str]] | None = None,
    exact_limit: int = EXACT_LIMIT,
    seed: int = 0,
    neighbours: int = 10,
    tolerance: float = 2e-4,
) -> Ring:
    """The best cyclic order of members 0..n-1: maximal bottleneck bandwidth, then fewest rack crossings, then
    minimal summed latency.

    ``racks`` (one label per member): the exact method breaks bottleneck ties by fewest rack crossings (then
    latency); the heuristic builds its first tour rack by rack from it. ``tiers`` (per member, the tiers above
    its rack, top first: e.g. spine then block): fewer crossings of a higher tier come before any rack
    crossing, and the heuristic's first tour keeps each group of each tier together.
    ``tolerance`` ends the heuristic's bottleneck search once its bracket is that close (relative).
    Raises `RingOrderError` for matrices that are not square, symmetric, finite and positive.
    """
    bw, lat = checked_arrays(bandwidth, latency)
    n = bw.shape[0]
    if racks is not None and len(racks) != n:
        raise RingOrderError(f"racks has {len(racks)} labels for {n} members")
    if tiers is not None and len(tiers) != n:
        raise RingOrderError(f"tiers has {len(tiers)} entries for {n} members")
    if exact_limit > 16:
        raise RingOrderError(f"exact_limit must be at most 16 (2^n states), got {exact_limit}")
    if n <= 3:
        order = list(range(n))
        bottleneck, total = array_metrics(order, bw, lat)
        return Ring(order=tuple(order), bottleneck_gbps=bottleneck, total_latency_us=total, method="trivial")
    if n <= exact_limit:
        return exact_ring(bw, lat, racks, tiers)
    return heuristic_ring(bw, lat, racks, tiers=tiers, seed=seed, neighbours=neighbours, tolerance=tolerance)
