"""The mixed pair matrix of a sparse probe round: measured pairs as measured, the rest inferred.

Purpose: ``SampledMatrix`` (bandwidth, latency and which entries were measured) and ``infer_matrix``: a pair
not probed takes its group's median (its pair of racks, or its rack), capped by the best figure each end
reached, so a node with a slow NIC drags its unprobed pairs down too.

Non-goals: choosing which pairs to probe and diagnosing slow NICs, uplinks or cables (``sampling``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from topo_tune.topology.distance import PairEstimate, PairMatrix

Pair = tuple[str, str]


@dataclass
class PairFigure:
    """One measured pair: bandwidth GB/s, latency µs."""

    bandwidth: float
    latency: float


@dataclass(frozen=True)
class SampledMatrix:
    """The mixed matrix: measured pairs as measured, the rest inferred. Bandwidth GB/s (diagonal infinite),
    latency µs; ``measured[i, j]`` says which."""

    names: tuple[str, ...]
    bandwidth: npt.NDArray[np.float64]
    latency: npt.NDArray[np.float64]
    measured: npt.NDArray[np.bool_]

    def source(self, a: str, b: str) -> Literal["measured", "inferred"]:
        i, j = self.names.index(a), self.names.index(b)
        return "measured" if self.measured[i, j] else "inferred"

    @property
    def measured_pairs(self) -> int:
        return int(np.triu(self.measured, 1).sum())

    def to_pair_matrix(self, *, method: str = "sparse probe sample") -> PairMatrix:
        """As a `PairMatrix` (measured entries ``measured``, the rest ``inferred``), for the rank-map planner."""
        estimates: dict[Pair, PairEstimate] = {}
        weights = PairMatrix(names=(), estimates={}).weights
        n = len(self.names)
        for i in range(n):
            for j in range(i + 1, n):
                rate = float(self.bandwidth[i, j])
                estimates[(self.names[i], self.names[j])] = PairEstimate(
                    bandwidth_gbps=rate,
                    latency_us=float(self.latency[i, j]),
                    hops=0,
                    cross_numa=False,
                    distance=weights.distance(hops=0, bandwidth_gbps=rate, cross_numa=False),
                    source="measured" if self.measured[i, j] else "inferred",
                    method=method if self.measured[i, j] else "inferred from the rack model",
                )
        return PairMatrix(names=self.names, estimates=estimates, weights=weights)


def infer_matrix(
    rack_of: Mapping[str, str], figures: Mapping[Pair, PairFigure], *, unreliable: Set[str] = frozenset()
) -> SampledMatrix:
    """Every pair of ``rack_of``'s nodes: measured where ``figures`` has it, else ``min(group median, best
    figure of each end)``. Pairs touching an ``unreliable`` node (a slow NIC) stay out of the group medians."""
    names = tuple(sorted(rack_of))
    index = {n: i for i, n in enumerate(names)}
    n = len(names)
    cap = np.full(n, np.inf)
    groups: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for (a, b), fig in figures.items():
        for node in (a, b):
            cap[index[node]] = fig.bandwidth if math.isinf(cap[index[node]]) else max(cap[index[node]], fig.bandwidth)
        if a in unreliable or b in unreliable:
            continue
        bws, lats = groups.setdefault(rack_group(rack_of, a, b), ([], []))
        bws.append(fig.bandwidth)
        lats.append(fig.latency)
    inter_bw = [v for (ra, rb), (bws, _) in groups.items() if ra != rb for v in bws]
    inter_lat = [v for (ra, rb), (_, lats) in groups.items() if ra != rb for v in lats]
    all_bw = [f.bandwidth for f in figures.values()] or [1.0]
    all_lat = [f.latency for f in figures.values()] or [0.0]
    fallback_inter = (statistics.median(inter_bw or all_bw), statistics.median(inter_lat or all_lat))
    rack_names = sorted(set(rack_of.values()))
    rack_index = {r: k for k, r in enumerate(rack_names)}
    r = len(rack_names)
    group_bw = np.empty((r, r))
    group_lat = np.empty((r, r))
    for x, ra in enumerate(rack_names):
        for y, rb in enumerate(rack_names):
            found = groups.get((ra, rb) if ra <= rb else (rb, ra))
            if found:
                group_bw[x, y], group_lat[x, y] = statistics.median(found[0]), statistics.median(found[1])
            elif x != y:
                group_bw[x, y], group_lat[x, y] = fallback_inter
            else:
                group_bw[x, y], group_lat[x, y] = statistics.median(all_bw), statistics.median(all_lat)
    racks = np.array([rack_index[rack_of[name]] for name in names])
    bandwidth = group_bw[racks[:, None], racks[None, :]]
    bandwidth = np.minimum(bandwidth, np.minimum(cap[:, None], cap[None, :]))
    latency = group_lat[racks[:, None], racks[None, :]].copy()
    measured = np.zeros((n, n), dtype=bool)
    for (a, b), fig in figures.items():
        i, j = index[a], index[b]
        bandwidth[i, j] = bandwidth[j, i] = fig.bandwidth
        latency[i, j] = latency[j, i] = fig.latency
        measured[i, j] = measured[j, i] = True
    np.fill_diagonal(bandwidth, np.inf)
    np.fill_diagonal(latency, 0.0)
    return SampledMatrix(names=names, bandwidth=bandwidth, latency=latency, measured=measured)


def rack_group(rack_of: Mapping[str, str], a: str, b: str) -> tuple[str, str]:
    """The (smaller, larger) racks of a pair: the group whose median stands in for its unprobed pairs."""
    ra, rb = rack_of[a], rack_of[b]
    return (ra, rb) if ra <= rb else (rb, ra)
