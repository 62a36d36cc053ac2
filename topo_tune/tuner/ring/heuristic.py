"""The ring heuristic for instances too large for the exact method.

Purpose: a rack- and tier-aware first tour (each spine block's racks visited together, each rack's nodes
together, so a ring over B blocks of R racks crosses between blocks B times and between racks R times), then
2-opt and Or-opt under a penalty for edges below a bottleneck target, the target found by a search from an
upper bound downward, with double-bridge kicks out of local optima. The moves weigh latency, not crossings:
a modelled matrix keeps the tour's groups together by its higher latency across each tier (``node_pair_matrix``).
Seeded: the same inputs give the same ring.

Non-goals: optimality (``ring_exact`` is exact for small instances); input checks (``ring``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from topo_tune.tuner.ring.exact import EXACT_LIMIT, exact_ring
from topo_tune.tuner.ring.model import FloatArray, Ring, array_metrics, array_upper_bound, member_paths


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


def _construct(problem: _Problem, paths: list[tuple[str, ...]] | None, target: float) -> list[int]:
    """A first tour visiting each group of each tier contiguously (the top tier's groups, within each the next
    tier's, down to racks), so a ring over G groups of a tier crosses that tier's boundaries G times."""
    n = problem.bw.shape[0]
    return _arrange(problem, problem.cost(target), list(range(n)), paths or [("",)] * n, 0)


def _arrange(
    problem: _Problem, cost: FloatArray, members: list[int], paths: list[tuple[str, ...]], level: int
) -> list[int]:
    """A path through ``members`` visiting each of their groups at ``level`` (0: the top tier, the last: racks)
    contiguously, the groups in the order of a ring over the best link between each pair of groups."""
    groups: dict[str, list[int]] = {}
    for member in members:
        groups.setdefault(paths[member][level], []).append(member)
    last = level == len(paths[members[0]]) - 1
    parts = {
        name: _path_nn(inside, cost) if last else _arrange(problem, cost, inside, paths, level + 1)
        for name, inside in groups.items()
    }
    names = sorted(parts)
    if len(names) == 1:
        return parts[names[0]]
    tour: list[int] = []
    for x in _group_order(problem, [groups[name] for name in names]):
        path = parts[names[x]]
        if tour and len(path) > 1 and cost[tour[-1], path[-1]] < cost[tour[-1], path[0]]:
            path = path[::-1]
        tour.extend(path)
    return tour


def _group_order(problem: _Problem, groups: list[list[int]]) -> list[int]:
    """A ring over groups on the best link between each pair of them, exact when small."""
    bw, lat = problem.bw, problem.lat
    r = len(groups)
    group_bw = np.zeros((r, r))
    group_lat = np.zeros((r, r))
    for x in range(r):
        for y in range(x + 1, r):
            block = np.ix_(groups[x], groups[y])
            group_bw[x, y] = group_bw[y, x] = float(bw[block].max())
            group_lat[x, y] = group_lat[y, x] = float(lat[block].min())
    if r <= 3:
        return list(range(r))
    if r <= EXACT_LIMIT:
        return list(exact_ring(group_bw, group_lat).order)
    group_cost = -group_bw
    np.fill_diagonal(group_cost, np.inf)
    return _path_nn(list(range(r)), group_cost)


def heuristic_ring(
    bw: FloatArray,
    lat: FloatArray,
    racks: Sequence[str] | None,
    *,
    tiers: Sequence[Sequence[str]] | None = None,
    seed: int,
    neighbours: int,
    tolerance: float,
) -> Ring:
    n = bw.shape[0]
    problem = _Problem(bw, lat, neighbours)
    bound = array_upper_bound(bw, racks)
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
    start = _construct(problem, member_paths(racks, tiers, n), candidates[-1])
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
    bottleneck, total = array_metrics(best.tour, bw, lat)
    return Ring(order=tuple(best.tour), bottleneck_gbps=bottleneck, total_latency_us=total, method="heuristic")
