"""A ring of members and what it achieves: bottleneck bandwidth, summed latency, rack and tier crossings.

Purpose: the ``Ring`` record, checking the bandwidth and latency matrices a ring problem is posed on
(``RingOrderError`` names the entry), a ring's metrics, an upper bound no ring can beat, one canonical
rotation per ring, and each member's path through the network (``member_paths``: the tiers above its rack,
such as a spine block, then the rack) with the crossing weights that make one crossing of a higher tier
outweigh every crossing below it.

Non-goals: finding a good ring (``ring_order``, ``ring_exact``, ``ring_heuristic``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from topo_tune.errors import RingOrderError

FloatArray = npt.NDArray[np.float64]
Matrix = Sequence[Sequence[float]] | FloatArray


"""Nested lists, or an array (a 4,096-node matrix as lists of floats would take gigabytes)."""


@dataclass(frozen=True)
class Ring:
    """A cyclic order of members 0..n-1 and what it is predicted to achieve."""

    order: tuple[int, ...]
    bottleneck_gbps: float
    total_latency_us: float
    method: str  # "exact", "heuristic" or "trivial"


def checked_arrays(bandwidth: Matrix, latency: Matrix | None) -> tuple[FloatArray, FloatArray]:
    try:
        bw = np.asarray(bandwidth, dtype=np.float64)
    except ValueError as exc:
        raise RingOrderError(f"bandwidth must be a square matrix of numbers: {exc}") from exc
    n = bw.shape[0] if bw.ndim == 2 else -1
    if bw.ndim != 2 or bw.shape != (n, n):
        raise RingOrderError(f"bandwidth must be a square matrix, got shape {bw.shape}")
    try:
        lat = np.zeros((n, n)) if latency is None else np.asarray(latency, dtype=np.float64)
    except ValueError as exc:
        raise RingOrderError(f"latency must be a square matrix of numbers: {exc}") from exc
    if lat.shape != (n, n):
        raise RingOrderError(f"latency must have the bandwidth's shape {bw.shape}, got {lat.shape}")
    for name, m in (("bandwidth", bw), ("latency", lat)):
        off = ~np.eye(n, dtype=bool)
        bad = np.argwhere(off & ~np.isfinite(m))
        if bad.size:
            i, j = bad[0]
            raise RingOrderError(f"{name}[{i}][{j}] is not a finite number")
        asym = np.argwhere(off & ~np.isclose(m, m.T, rtol=1e-9, atol=1e-12))
        if asym.size:
            i, j = asym[0]
            raise RingOrderError(f"{name} must be symmetric: [{i}][{j}]={m[i, j]} but [{j}][{i}]={m[j, i]}")
    neg = np.argwhere(~np.eye(n, dtype=bool) & (bw <= 0))
    if neg.size:
        i, j = neg[0]
        raise RingOrderError(f"bandwidth[{i}][{j}] must be positive, got {bw[i, j]}")
    if np.any(lat < 0):
        i, j = np.argwhere(lat < 0)[0]
        raise RingOrderError(f"latency[{i}][{j}] must not be negative, got {lat[i, j]}")
    return bw, lat


def ring_metrics(order: Sequence[int], bandwidth: Matrix, latency: Matrix | None = None) -> tuple[float, float]:
    """(bottleneck bandwidth, total latency) of the cyclic order."""
    bw, lat = checked_arrays(bandwidth, latency)
    return array_metrics(list(order), bw, lat)


def array_metrics(order: list[int], bw: FloatArray, lat: FloatArray) -> tuple[float, float]:
    n = len(order)
    if n < 2:
        return math.inf, 0.0
    if n == 2:
        a, b = order
        return float(bw[a, b]), float(2 * lat[a, b])
    idx = np.asarray(order)
    nxt = np.roll(idx, -1)
    return float(bw[idx, nxt].min()), float(lat[idx, nxt].sum())


def upper_bound(bandwidth: Matrix, racks: Sequence[str] | None = None) -> float:
    """A bound no ring can beat: every member needs two ring edges (its second-best link), and every rack's
    boundary is crossed at least twice (the second-best link leaving it)."""
    bw, _ = checked_arrays(bandwidth, None)
    return array_upper_bound(bw, racks)


def array_upper_bound(bw: FloatArray, racks: Sequence[str] | None) -> float:
    n = bw.shape[0]
    if n < 3:
        return float(bw[0, 1]) if n == 2 else math.inf
    masked = bw.copy()
    np.fill_diagonal(masked, -np.inf)
    second = np.sort(masked, axis=1)[:, -2]
    bound = float(second.min())
    if racks is not None and len(set(racks)) > 1:
        labels = np.asarray(list(racks))
        for rack in set(racks):
            inside = labels == rack
            cross = np.sort(bw[np.ix_(inside, ~inside)], axis=None)
            if cross.size >= 2:
                bound = min(bound, float(cross[-2]))
    return bound


def member_paths(
    racks: Sequence[str] | None, tiers: Sequence[Sequence[str]] | None, n: int
) -> list[tuple[str, ...]] | None:
    """Each member's path, all of one depth: the tiers above its rack, top first (a tier a member does not
    name is ""), then its rack. None when neither racks nor tiers are given."""
    if racks is None and tiers is None:
        return None
    rack = list(racks) if racks is not None else [""] * n
    above = [tuple(t) for t in tiers] if tiers is not None else [()] * n
    depth = max((len(a) for a in above), default=0)
    return [("",) * (depth - len(a)) + a + (r,) for a, r in zip(above, rack, strict=True)]


def crossing_matrix(racks: Sequence[str] | None, n: int, tiers: Sequence[Sequence[str]] | None = None) -> FloatArray:
    """What an edge between two members crosses: 1 per rack boundary, ``n + 1`` per boundary of the tier above,
    ``(n + 1)²`` per boundary of the tier above that, and so on, so that a ring's summed weight orders rings by
    the crossings of their highest tier first (a ring has n edges). All 0 without racks or tiers."""
    paths = member_paths(racks, tiers, n)
    weight: FloatArray = np.zeros((n, n))
    if paths is None:
        return weight
    depth = len(paths[0]) if paths else 0
    for level in range(depth):  # 0: the rack; a member pair parted at a tier is parted at every tier below it
        labels = np.asarray(["\x1f".join(p[: depth - level]) for p in paths])
        weight += (labels[:, None] != labels[None, :]) * float(n + 1) ** level
    return weight


def rack_crossings(order: Sequence[int], racks: Sequence[str]) -> int:
    """How many edges of the cyclic order join members of different racks."""
    n = len(order)
    return sum(racks[order[i]] != racks[order[(i + 1) % n]] for i in range(n)) if n > 1 else 0


def canonical_rotation(order: Sequence[int]) -> tuple[int, ...]:
    """The same ring started at its smallest member and turned the way of its smaller neighbour."""
    n = len(order)
    if n < 3:
        return tuple(order)
    i = list(order).index(min(order))
    rotated = list(order[i:]) + list(order[:i])
    if rotated[-1] < rotated[1]:
        rotated = [rotated[0], *reversed(rotated[1:])]
    return tuple(rotated)
