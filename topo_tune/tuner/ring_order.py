"""The ring-order optimizer: which order of nodes (or of a node's GPUs) makes the best NCCL ring.

Purpose: NCCL chains nodes into its rings in the order of their lowest global rank (NCCL_FACTS §2.1), so the rank
order a launcher uses *is* the inter-node ring. Given a symmetric bandwidth matrix and a latency matrix, find the
cyclic order that maximises the ring's bottleneck bandwidth and, among orders with that bottleneck, crosses
between racks the fewest times (when racks are given), then minimises the summed latency. The crossings come
before latency because a pair matrix models each node pair alone: a ring crossing the spine four times shows
the same bottleneck as one crossing it twice, yet its crossings share the spine's uplinks. Exact for up to
`EXACT_LIMIT` members (a Hamiltonian-cycle check over bitmasks for the bottleneck, then Held–Karp for
crossings and latency). Larger instances: a rack-aware construction (racks visited contiguously, so a ring
over R racks crosses the spine R times), then 2-opt and Or-opt under a penalty for edges below the bottleneck
target, with the target found by search from an upper bound downward.
Non-goals: trees, multi-ring (per-channel) plans, and launching anything.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from topo_tune.errors import TopoTuneError

logger = logging.getLogger(__name__)

EXACT_LIMIT = 12
FloatArray = npt.NDArray[np.float64]
Matrix = Sequence[Sequence[float]] | FloatArray
"""Nested lists, or an array (a 4,096-node matrix as lists of floats would take gigabytes)."""


class RingOrderError(TopoTuneError, ValueError):
    """Input matrices that cannot describe a ring problem; the message names the argument and entry."""


@dataclass(frozen=True)
class Ring:
    """A cyclic order of members 0..n-1 and what it is predicted to achieve."""

    order: tuple[int, ...]
    bottleneck_gbps: float
    total_latency_us: float
    method: str  # "exact", "heuristic" or "trivial"


def _as_arrays(bandwidth: Matrix, latency: Matrix | None) -> tuple[FloatArray, FloatArray]:
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
    bw, lat = _as_arrays(bandwidth, latency)
    return _metrics(list(order), bw, lat)


def _metrics(order: list[int], bw: FloatArray, lat: FloatArray) -> tuple[float, float]:
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
    bw, _ = _as_arrays(bandwidth, None)
    return _upper_bound(bw, racks)


def _upper_bound(bw: FloatArray, racks: Sequence[str] | None) -> float:
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


# --- exact ---------------------------------------------------------------------------------------------


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


def _exact(bw: FloatArray, lat: FloatArray, racks: Sequence[str] | None = None) -> Ring:
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
    # latency of every edge together, so the summed cost orders rings by crossings first, exactly.
    crossing = _crossing_matrix(racks, n) * (float(lat.sum()) + 1.0)
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
    bottleneck, total = _metrics(list(order_t), bw, lat)
    return Ring(order=order_t, bottleneck_gbps=bottleneck, total_latency_us=total, method="exact")


def _crossing_matrix(racks: Sequence[str] | None, n: int) -> FloatArray:
    """1 where the two members sit in different racks, else 0 (all 0 without racks)."""
    if racks is None:
        return np.zeros((n, n))
    labels = np.asarray(list(racks))
    crossing: FloatArray = (labels[:, None] != labels[None, :]).astype(np.float64)
    return crossing


def rack_crossings(order: Sequence[int], racks: Sequence[str]) -> int:
    """How many edges of the cyclic order join members of different racks."""
    n = len(order)
    return sum(racks[order[i]] != racks[order[(i + 1) % n]] for i in range(n)) if n > 1 else 0


# --- heuristic -----------------------------------------------------------------------------------------


class _Tour:
    """A tour under the cost ``penalty·[bw < target] + latency`` with 2-opt and Or-opt moves."""

    def __init__(self, order: list[int], problem: _Problem, target: float) -> None:
        self.n = len(order)
        self.p = problem
        self.target = target
        self.near = problem.neighbours(target)
        self.tour = list(order)
        self.pos = [0] * self.n
        for i, v in enumerate(self.tour):
            self.pos[v] = i

    def c(self, a: int, b: int) -> float:
        lat = self.p.latl[a][b]
        return lat + self.p.penalty if self.p.bwl[a][b] < self.target else lat

    def _reindex(self, lo: int, hi: int) -> None:
        for i in range(lo, hi + 1):
            self.pos[self.tour[i]] = i

    def _reverse(self, i: int, j: int) -> None:
        """Reverse tour[i..j] (positions, i <= j)."""
        self.tour[i : j + 1] = self.tour[i : j + 1][::-1]
        self._reindex(i, j)

    def two_opt(self) -> bool:
        n, tour, pos, c = self.n, self.tour, self.pos, self.c
        improved_any = False
        improved = True
        while improved:
            improved = False
            for a in range(n):
                i = pos[a]
                b = tour[(i + 1) % n]
                d_ab = c(a, b)
                for cand in self.near[a]:
                    c_ac = c(a, cand)
                    if c_ac >= d_ab:
                        break  # neighbour lists are sorted: no later candidate can gain either
                    j = pos[cand]
                    d = tour[(j + 1) % n]
                    if cand == b or d == a:
                        continue
                    if c_ac + c(b, d) - d_ab - c(cand, d) < -1e-9:
                        # New edges (a,cand) and (b,d): reverse the stretch b..cand.
                        lo, hi = (i + 1) % n, j
                        if lo <= hi:
                            self._reverse(lo, hi)
                        else:
                            self._reverse(hi + 1, i)
                        improved = improved_any = True
                        break
        return improved_any

    def or_opt(self) -> bool:
        n, c = self.n, self.c
        improved_any = False
        for seg_len in (1, 2, 3):
            if seg_len >= n - 2:
                break
            improved = True
            while improved:
                improved = False
                for s in range(n):
                    tour, pos = self.tour, self.pos
                    e = (s + seg_len - 1) % n
                    p, q = tour[(s - 1) % n], tour[(e + 1) % n]
                    first, last = tour[s], tour[e]
                    removed = c(p, first) + c(last, q) - c(p, q)
                    if removed <= 1e-9:
                        continue
                    segment = {tour[(s + k) % n] for k in range(seg_len)}
                    move: tuple[int, bool] | None = None
                    for end_node, reverse in ((first, False), (last, True)):
                        for x in self.near[end_node]:
                            if c(end_node, x) >= removed:
                                break
                            if x in segment:
                                continue
                            for left in (x, tour[(pos[x] - 1) % n]):
                                y = tour[(pos[left] + 1) % n]
                                if left in segment or y in segment:
                                    continue
                                # Segment goes between left and y; orient it so end_node touches x.
                                if (left == x) != reverse:
                                    add = c(left, first) + c(last, y) - c(left, y)
                                    rev = False
                                else:
                                    add = c(left, last) + c(first, y) - c(left, y)
                                    rev = True
                                if add - removed < -1e-9:
                                    move = (left, rev)
                                    break
                            if move:
                                break
                        if move:
                            break
                    if move is None:
                        continue
                    left, rev = move
                    seg = [tour[(s + k) % n] for k in range(seg_len)]
                    if rev:
                        seg.reverse()
                    rest = [v for v in tour if v not in segment]
                    at = rest.index(left) + 1
                    self.tour = rest[:at] + seg + rest[at:]
                    self._reindex(0, n - 1)
                    improved = improved_any = True
        return improved_any

    def optimise(self) -> None:
        while True:
            a = self.two_opt()
            b = self.or_opt()
            if not (a or b):
                return

    def violations(self) -> int:
        t, bwl = self.tour, self.p.bwl
        return sum(1 for i in range(self.n) if bwl[t[i]][t[(i + 1) % self.n]] < self.target)


class _Problem:
    """One heuristic instance: matrices as Python lists for fast scalar access, neighbour lists per target."""

    def __init__(self, bw: FloatArray, lat: FloatArray, neighbours: int) -> None:
        self.bw = bw
        self.lat = lat
        self.bwl: list[list[float]] = bw.tolist()
        self.latl: list[list[float]] = lat.tolist()
        # One violation must outweigh any latency saving.
        self.penalty = float(lat.sum()) + 1.0
        self.k = min(neighbours, bw.shape[0] - 1)
        self._near: dict[float, list[list[int]]] = {}

    def cost(self, target: float) -> FloatArray:
        cost = np.where(self.bw >= target, self.lat, self.lat + self.penalty)
        np.fill_diagonal(cost, np.inf)
        return cost

    def neighbours(self, target: float) -> list[list[int]]:
        if target not in self._near:
            cost = self.cost(target)
            part = np.argpartition(cost, self.k - 1, axis=1)[:, : self.k]
            order = np.argsort(np.take_along_axis(cost, part, axis=1), axis=1)
            self._near[target] = np.take_along_axis(part, order, axis=1).tolist()
        return self._near[target]


def _path_nn(members: list[int], cost: FloatArray) -> list[int]:
    """Nearest-neighbour path through ``members`` (numpy per step: O(k) per step, k steps)."""
    if len(members) <= 2:
        return list(members)
    idx = np.asarray(members)
    sub = cost[np.ix_(idx, idx)].copy()
    np.fill_diagonal(sub, np.inf)
    visited = np.zeros(len(members), dtype=bool)
    current = int(np.argmin(np.sort(sub, axis=1)[:, 1]))  # start where the second-best link is worst
    path = [current]
    visited[current] = True
    for _ in range(len(members) - 1):
        row = np.where(visited, np.inf, sub[current])
        current = int(np.argmin(row))
        visited[current] = True
        path.append(current)
    return [members[i] for i in path]


def _construct(problem: _Problem, racks: Sequence[str] | None, target: float) -> list[int]:
    bw, lat = problem.bw, problem.lat
    n = bw.shape[0]
    cost = problem.cost(target)
    labels = list(racks) if racks is not None else ["" for _ in range(n)]
    groups: dict[str, list[int]] = {}
    for member, rack in enumerate(labels):
        groups.setdefault(rack, []).append(member)
    paths = {rack: _path_nn(members, cost) for rack, members in groups.items()}
    names = sorted(paths)
    if len(names) == 1:
        return paths[names[0]]
    # Rack order: a ring over racks on the best link between each pair of racks, exact when small.
    r = len(names)
    rack_bw = np.zeros((r, r))
    rack_lat = np.zeros((r, r))
    for x in range(r):
        for y in range(x + 1, r):
            block = np.ix_(groups[names[x]], groups[names[y]])
            rack_bw[x, y] = rack_bw[y, x] = float(bw[block].max())
            rack_lat[x, y] = rack_lat[y, x] = float(lat[block].min())
    if r <= 3:
        rack_order = list(range(r))
    elif r <= EXACT_LIMIT:
        rack_order = list(_exact(rack_bw, rack_lat).order)
    else:
        rack_cost = -rack_bw
        np.fill_diagonal(rack_cost, np.inf)
        rack_order = _path_nn(list(range(r)), rack_cost)
    tour: list[int] = []
    for x in rack_order:
        path = paths[names[x]]
        if tour and len(path) > 1 and cost[tour[-1], path[-1]] < cost[tour[-1], path[0]]:
            path = path[::-1]
        tour.extend(path)
    return tour


def _heuristic(
    bw: FloatArray,
    lat: FloatArray,
    racks: Sequence[str] | None,
    *,
    seed: int,
    neighbours: int,
    tolerance: float,
) -> Ring:
    n = bw.shape[0]
    problem = _Problem(bw, lat, neighbours)
    bound = _upper_bound(bw, racks)
    values = np.unique(bw[~np.eye(n, dtype=bool)])
    candidates = [float(v) for v in values if v <= bound + 1e-12]
    rng = random.Random(seed)

    # Small instances can afford many kicks; large ones start from a rack-aware tour that rarely needs them.
    kicks = max(2, 4000 // n)

    def attempt(target: float, start: list[int]) -> _Tour:
        best = _Tour(start, problem, target)
        best.optimise()
        best_violations = best.violations()
        for _ in range(kicks):
            if not best_violations:
                break
            # A double-bridge kick to leave a local optimum that still has violations; keep it if better.
            t = best.tour
            a, b, c = sorted(rng.sample(range(1, n), 3))
            tour = _Tour(t[:a] + t[b:c] + t[a:b] + t[c:], problem, target)
            tour.optimise()
            violations = tour.violations()
            if violations <= best_violations:
                best, best_violations = tour, violations
        return best

    # The target starts at the upper bound; below it, a binary search over the distinct bandwidths, each try
    # warm-started from the last tour, stops once the bracket is within ``tolerance`` (relative).
    start = _construct(problem, racks, candidates[-1])
    best = attempt(candidates[-1], start)
    if best.violations():
        lo, hi = 0, len(candidates) - 2
        feasible: _Tour | None = None
        current = best.tour
        while lo <= hi:
            mid = (lo + hi + 1) // 2
            tour = attempt(candidates[mid], current)
            current = tour.tour
            if tour.violations() == 0:
                feasible, lo = tour, mid + 1
                if candidates[hi] <= candidates[mid] * (1 + tolerance):
                    break
            else:
                hi = mid - 1
        best = feasible if feasible is not None else attempt(candidates[0], current)
    bottleneck, total = _metrics(best.tour, bw, lat)
    return Ring(order=tuple(best.tour), bottleneck_gbps=bottleneck, total_latency_us=total, method="heuristic")


def optimize_ring(
    bandwidth: Matrix,
    latency: Matrix | None = None,
    *,
    racks: Sequence[str] | None = None,
    exact_limit: int = EXACT_LIMIT,
    seed: int = 0,
    neighbours: int = 10,
    tolerance: float = 2e-4,
) -> Ring:
    """The best cyclic order of members 0..n-1: maximal bottleneck bandwidth, then fewest rack crossings, then
    minimal summed latency.

    ``racks`` (one label per member): the exact method breaks bottleneck ties by fewest rack crossings (then
    latency); the heuristic builds its first tour rack by rack from it.
    ``tolerance`` ends the heuristic's bottleneck search once its bracket is that close (relative).
    Raises `RingOrderError` for matrices that are not square, symmetric, finite and positive.
    """
    bw, lat = _as_arrays(bandwidth, latency)
    n = bw.shape[0]
    if racks is not None and len(racks) != n:
        raise RingOrderError(f"racks has {len(racks)} labels for {n} members")
    if exact_limit > 16:
        raise RingOrderError(f"exact_limit must be at most 16 (2^n states), got {exact_limit}")
    if n <= 3:
        order = list(range(n))
        bottleneck, total = _metrics(order, bw, lat)
        return Ring(order=tuple(order), bottleneck_gbps=bottleneck, total_latency_us=total, method="trivial")
    if n <= exact_limit:
        return _exact(bw, lat, racks)
    return _heuristic(bw, lat, racks, seed=seed, neighbours=neighbours, tolerance=tolerance)


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
