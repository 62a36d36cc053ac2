"""The exact ring for up to ``EXACT_LIMIT`` members.

Purpose: the largest bottleneck for which a Hamiltonian cycle exists (a check over bitmasks), then Held–Karp
over that cycle's edges for the fewest crossings of the highest tier given (a spine block's boundary), then
of each tier below it down to the racks, and then the least summed latency.

Non-goals: larger instances (``ring_heuristic``); input checks (``ring``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from topo_tune.tuner.ring.model import FloatArray, Ring, array_metrics, crossing_matrix

EXACT_LIMIT = 12


def _has_hamiltonian_cycle(adj: list[int], n: int) -> bool:
    """Bitmask DP: ends[mask] = set of j such that a path from 0 through exactly mask ends at j."""
    full = (1 << n) - 1
    ends = [0] * (1 << n)
    ends[1] = 1
    for mask in range(1, full + 1, 2):  # masks containing member 0
        e = ends[mask]
        while e:
            low = e & -e
            j = low.bit_length() - 1
            e ^= low
            step = adj[j] & ~mask
            while step:
                nb = step & -step
                ends[mask | nb] |= nb
                step ^= nb
    return bool(ends[full] & adj[0])


def exact_ring(
    bw: FloatArray, lat: FloatArray, racks: Sequence[str] | None = None, tiers: Sequence[Sequence[str]] | None = None
) -> Ring:
    n = bw.shape[0]
    thresholds = sorted({float(bw[i, j]) for i in range(n) for j in range(i + 1, n)})
    lo, hi = 0, len(thresholds) - 1
    # Bottleneck: the largest threshold whose graph of edges >= threshold still has a Hamiltonian cycle.
    best = 0
    while lo <= hi:
        mid = (lo + hi) // 2
        t = thresholds[mid]
        adj = [sum(1 << j for j in range(n) if j != i and bw[i, j] >= t) for i in range(n)]
        if _has_hamiltonian_cycle(adj, n):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    target = thresholds[best]
    # Crossings, then latency: Held–Karp over the allowed edges only. One crossing weighs more than the
    # latency of every edge together (and one of a higher tier more than all below it), so the summed cost
    # orders rings by crossings first, exactly.
    crossing = crossing_matrix(racks, n, tiers) * (float(lat.sum()) + 1.0)
    cost = np.where(bw >= target, lat + crossing, np.inf)
    np.fill_diagonal(cost, np.inf)
    size = 1 << n
    dp = np.full((size, n), np.inf)
    parent = np.full((size, n), -1, dtype=np.int64)
    dp[1, 0] = 0.0
    for mask in range(1, size, 2):
        row = dp[mask]
        if not np.isfinite(row).any():
            continue
        for j in range(1, n):
            bit = 1 << j
            if mask & bit:
                continue
            cand = row + cost[:, j]
            k = int(np.argmin(cand))
            value = cand[k]
            nmask = mask | bit
            if value < dp[nmask, j]:
                dp[nmask, j] = value
                parent[nmask, j] = k
    full = size - 1
    closing = dp[full] + cost[:, 0]
    last = int(np.argmin(closing))
    order = []
    mask, j = full, last
    while j != -1 and mask:
        order.append(j)
        prev = int(parent[mask, j])
        mask ^= 1 << j
        j = prev
    order.reverse()
    order_t = tuple(order)
    bottleneck, total = array_metrics(list(order_t), bw, lat)
    return Ring(order=order_t, bottleneck_gbps=bottleneck, total_latency_us=total, method="exact")
