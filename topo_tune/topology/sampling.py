"""Sparse, topology-guided probing: which node pairs to measure, and the rest inferred from the rack model.

Purpose: a full probe matrix over n nodes takes n-1 rounds, yet the rack structure predicts most pairs. The
sampler measures what the model cannot predict: a ring inside each rack (every node in two pairs) or every
intra-rack pair; for every pair of racks a sample of cross-rack pairs, grown until its mean is known to
``rel_error``; at least two pairs for every node. When a measured pair reads as an outlier it escalates: each
end is probed with other peers, so that a slow NIC (every pair of the node slow), a slow cable (one pair) and
a slow rack uplink (every cross-rack pair of the rack) tell apart. Every other pair is inferred from the rack
model (``sampled_matrix``: the median of its group, capped by what each end reached) and marked inferred.
``pair_rounds`` packs a batch into rounds of disjoint pairs.
Non-goals: running probes (the controller does) and rate models of particular fabrics.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from topo_tune.topology.sampled_matrix import Pair, PairFigure, SampledMatrix, infer_matrix, rack_group

SamplingMode = Literal["full", "sparse"]
SAMPLING_MODES: tuple[SamplingMode, ...] = ("full", "sparse")
SPARSE_ABOVE = 64
"""Clusters of more nodes than this are probed sparsely unless the operator asks for the full matrix."""


def default_mode(nodes: int) -> SamplingMode:
    """``full`` up to `SPARSE_ABOVE` nodes (a full matrix is cheap there), ``sparse`` above."""
    return "sparse" if nodes > SPARSE_ABOVE else "full"


def _key(a: str, b: str) -> Pair:
    return (a, b) if a < b else (b, a)


@dataclass(frozen=True)
class SamplingPolicy:
    """How sparse: what is probed inside racks and between them, and what counts as an outlier."""

    intra: Literal["ring", "all"] = "ring"
    """``ring``: a ring through each rack (every node in two intra-rack pairs); ``all``: every intra-rack pair."""
    inter_first: int = 3
    """Cross-rack pairs sampled per pair of racks before their spread is known."""
    inter_max: int = 12
    """At most this many per pair of racks, however wide the spread."""
    rel_error: float = 0.01
    """Sample a pair of racks until two standard errors of its mean are within this share of the mean."""
    outlier: float = 0.15
    """A pair this far (relative) below its group's median is an outlier; so is a node or rack uplink."""
    escalate_peers: int = 2
    """Extra peers each end of an outlier pair is probed with (once per node)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.intra not in ("ring", "all"):
            raise ValueError(f"intra must be 'ring' or 'all', got {self.intra!r}")
        if not 1 <= self.inter_first <= self.inter_max:
            raise ValueError(f"need 1 <= inter_first <= inter_max, got {self.inter_first} and {self.inter_max}")
        if not 0 < self.rel_error < 1:
            raise ValueError(f"rel_error must be within (0, 1), got {self.rel_error}")
        if not 0 < self.outlier < 1:
            raise ValueError(f"outlier must be within (0, 1), got {self.outlier}")
        if self.escalate_peers < 1:
            raise ValueError(f"escalate_peers must be at least 1, got {self.escalate_peers}")


@dataclass(frozen=True)
class Findings:
    """What the measured pairs show: slow NICs, slow rack uplinks and single slow pairs (cables)."""

    degraded_nodes: tuple[str, ...]
    degraded_uplinks: tuple[str, ...]
    outlier_pairs: tuple[Pair, ...]


@dataclass
class PairSampler:
    """Plans probe batches over nodes in racks and infers the pairs it does not probe.

    Use: ``while batch := sampler.next_pairs(): probe them; sampler.record(...) / sampler.failed(...)``; then
    `matrix` and `findings`. Every pair is handed out at most once.
    """

    rack_of: Mapping[str, str]
    policy: SamplingPolicy = field(default_factory=SamplingPolicy)
    _racks: dict[str, list[str]] = field(init=False)
    _planned: set[Pair] = field(init=False, default_factory=set)
    _figures: dict[Pair, PairFigure] = field(init=False, default_factory=dict)
    _escalated: set[str] = field(init=False, default_factory=set)
    _fresh: list[Pair] = field(init=False, default_factory=list)
    _cursor: dict[str, int] = field(init=False, default_factory=dict)
    _failed: set[Pair] = field(init=False, default_factory=set)
    _attempts: dict[str, int] = field(init=False, default_factory=dict)
    _stage: int = field(init=False, default=0)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if len(self.rack_of) < 2:
            raise ValueError("sampling needs at least two nodes")
        racks: dict[str, list[str]] = {}
        for node in sorted(self.rack_of):
            if not self.rack_of[node]:
                raise ValueError(f"node {node!r} has an empty rack name")
            racks.setdefault(self.rack_of[node], []).append(node)
        self._rng = random.Random(self.policy.seed)
        for members in racks.values():
            self._rng.shuffle(members)
        self._racks = dict(sorted(racks.items()))
        self._cursor = dict.fromkeys(self._racks, 0)

    # --- planning ---------------------------------------------------------------------------------------

    @property
    def planned(self) -> frozenset[Pair]:
        """Every pair handed out so far."""
        return frozenset(self._planned)

    def next_pairs(self) -> list[Pair]:
        """The next batch to probe (each pair as (smaller, larger) name); empty when sampling is done."""
        batch: list[Pair] = []
        if self._stage == 0:
            self._stage = 1
            batch += self._intra()
            for x, rack_a in enumerate(self._racks):
                for rack_b in list(self._racks)[x + 1 :]:
                    batch += self._inter(rack_a, rack_b, self.policy.inter_first)
            batch += self._coverage(extra=batch)
            return self._plan(batch)
        batch += self._escalations()
        batch += self._variance()
        batch += self._coverage(extra=batch)
        return self._plan(batch)

    def _plan(self, pairs: Iterable[Pair]) -> list[Pair]:
        out: list[Pair] = []
        for a, b in pairs:
            key = _key(a, b)
            if a != b and key not in self._planned:
                self._planned.add(key)
                out.append(key)
        return out

    def _intra(self) -> list[Pair]:
        pairs: list[Pair] = []
        for members in self._racks.values():
            n = len(members)
            if self.policy.intra == "all" or n <= 3:
                pairs += [(a, b) for i, a in enumerate(members) for b in members[i + 1 :]]
            else:
                pairs += [(members[i], members[(i + 1) % n]) for i in range(n)]
        return pairs

    def _next_member(self, rack: str, avoid: set[str]) -> str | None:
        members = self._racks[rack]
        for _ in range(len(members)):
            node = members[self._cursor[rack] % len(members)]
            self._cursor[rack] += 1
            if node not in avoid:
                return node
        return None

    def _inter(self, rack_a: str, rack_b: str, count: int) -> list[Pair]:
        """``count`` new cross pairs between two racks, each rack's members taken in turn (balanced load)."""
        out: list[Pair] = []
        limit = len(self._racks[rack_a]) * len(self._racks[rack_b])
        tries = 0
        while len(out) < count and tries < 4 * count + len(self._racks[rack_a]):
            tries += 1
            a = self._next_member(rack_a, set())
            b = self._next_member(rack_b, set())
            assert a is not None and b is not None
            key = _key(a, b)
            if key in self._planned or key in out:
                if len(self._planned) >= limit:
                    break
                self._cursor[rack_b] += 1  # shift the pairing so the next try meets another peer
                continue
            out.append(key)
        return out

    def _coverage(self, *, extra: Sequence[Pair]) -> list[Pair]:
        """Pairs for nodes in fewer than two pairs that measured (or are about to be probed)."""
        counts = dict.fromkeys(self.rack_of, 0)
        pending = set(extra) | {p for p in self._planned if p not in self._figures and p not in self._failed}
        for a, b in (*self._figures, *pending):
            counts[a] += 1
            counts[b] += 1
        out: list[Pair] = []
        nodes = sorted(self.rack_of)
        for node in nodes:
            if counts[node] >= 2 or self._attempts.get(node, 0) >= 3:
                continue
            self._attempts[node] = self._attempts.get(node, 0) + 1
            peers = sorted(
                (n for n in nodes if n != node), key=lambda n: (counts[n], self.rack_of[n] == self.rack_of[node])
            )
            for peer in peers:
                key = _key(node, peer)
                if key in self._planned or key in out:
                    continue
                out.append(key)
                counts[node] += 1
                counts[peer] += 1
                if counts[node] >= 2:
                    break
        return out

    def _escalations(self) -> list[Pair]:
        out: list[Pair] = []
        fresh, self._fresh = self._fresh, []
        refs = self._reference()
        limit = 1.0 - self.policy.outlier
        # A rack already known for a slow uplink explains its slow cross-rack pairs: no need to look further.
        slow_racks = set(self._degraded_uplinks(set(self._degraded_nodes()))) if fresh else set()
        for a, b in fresh:
            ratio = self._ratio(a, b, refs)
            if ratio is None or ratio >= limit:
                continue
            if self.rack_of[a] != self.rack_of[b] and {self.rack_of[a], self.rack_of[b]} & slow_racks:
                continue
            for node, other in ((a, b), (b, a)):
                if node in self._escalated:
                    continue
                self._escalated.add(node)
                # The node with other peers of the other end's rack: slow with them too means the node's NIC.
                candidates = [p for p in self._racks[self.rack_of[other]] if p not in (node, other)]
                self._rng.shuffle(candidates)
                added = 0
                for peer in candidates:
                    key = _key(node, peer)
                    if key not in self._planned and key not in out:
                        out.append(key)
                        added += 1
                        if added >= self.policy.escalate_peers:
                            break
        return out

    def _variance(self) -> list[Pair]:
        out: list[Pair] = []
        degraded = set(self._degraded_nodes())
        groups = self._inter_groups(exclude=degraded)
        planned: dict[tuple[str, str], int] = {}
        for pair in self._planned:
            group = rack_group(self.rack_of, *pair)
            planned[group] = planned.get(group, 0) + 1
        names = list(self._racks)
        for x, rack_a in enumerate(names):
            for rack_b in names[x + 1 :]:
                values = groups.get((rack_a, rack_b), [])
                have = planned.get((rack_a, rack_b), 0)
                need = self._needed(values)
                if need > have:
                    out += self._inter(rack_a, rack_b, need - have)
        return out

    def _needed(self, values: Sequence[float]) -> int:
        p = self.policy
        if len(values) < 2:
            return p.inter_first
        mean = statistics.fmean(values)
        sd = statistics.stdev(values)
        if mean <= 0:
            return p.inter_max
        return max(p.inter_first, min(p.inter_max, math.ceil((2.0 * sd / (p.rel_error * mean)) ** 2)))

    def ring_pairs(self, order: Sequence[str]) -> list[Pair]:
        """The edges of a planned ring (cyclic ``order``) that were never probed: measure them before trusting
        the ring, since the planner may have picked inferred pairs that are slower than their group."""
        n = len(order)
        edges = [(order[i], order[(i + 1) % n]) for i in range(n)] if n > 2 else list(itertools.pairwise(order))
        for a, b in edges:
            if a not in self.rack_of or b not in self.rack_of:
                raise KeyError(f"the ring names {a if a not in self.rack_of else b!r}, which is not sampled")
        return self._plan(edges)

    # --- results ----------------------------------------------------------------------------------------

    def record(self, a: str, b: str, bandwidth_gbps: float, latency_us: float) -> None:
        """A probe's figures for a pair that was handed out."""
        key = _key(a, b)
        if key not in self._planned:
            raise KeyError(f"the pair {a}, {b} was not planned")
        if not (math.isfinite(bandwidth_gbps) and bandwidth_gbps > 0):
            raise ValueError(f"{a}-{b}: bandwidth {bandwidth_gbps} is not a positive number")
        if not (math.isfinite(latency_us) and latency_us >= 0):
            raise ValueError(f"{a}-{b}: latency {latency_us} is not a non-negative number")
        self._figures[key] = PairFigure(bandwidth_gbps, latency_us)
        self._fresh.append(key)

    def failed(self, a: str, b: str) -> None:
        """A probe that measured nothing: the pair stays inferred, its nodes may be given other peers."""
        self._failed.add(_key(a, b))

    def _reference(self) -> tuple[dict[str, float], float | None]:
        """Medians: of intra-rack pairs per rack, and across racks the median of the rack pairs' medians (each
        pair of racks one vote, so the extra samples around a slow rack do not move it)."""
        intra: dict[str, list[float]] = {}
        inter: dict[tuple[str, str], list[float]] = {}
        for (a, b), fig in self._figures.items():
            ra, rb = self.rack_of[a], self.rack_of[b]
            if ra == rb:
                intra.setdefault(ra, []).append(fig.bandwidth)
            else:
                inter.setdefault(rack_group(self.rack_of, a, b), []).append(fig.bandwidth)
        cross = statistics.median(statistics.median(v) for v in inter.values()) if inter else None
        return {r: statistics.median(v) for r, v in intra.items()}, cross

    def _ratio(self, a: str, b: str, refs: tuple[dict[str, float], float | None]) -> float | None:
        fig = self._figures.get(_key(a, b))
        if fig is None:
            return None
        ra, rb = self.rack_of[a], self.rack_of[b]
        ref = refs[0].get(ra) if ra == rb else refs[1]
        return fig.bandwidth / ref if ref else None

    def _node_scores(self) -> dict[str, float]:
        """Per node: the best ratio to its group's median over its measured pairs; low everywhere means its NIC.

        Intra-rack pairs decide where a node has any: across racks a slow NIC can hide under the spine's share.
        """
        refs = self._reference()
        best: dict[str, tuple[bool, float]] = {}
        for a, b in self._figures:
            ratio = self._ratio(a, b, refs)
            if ratio is None:
                continue
            intra = self.rack_of[a] == self.rack_of[b]
            for node in (a, b):
                score = (intra, ratio)
                best[node] = max(best.get(node, score), score)
        return {node: ratio for node, (_, ratio) in best.items()}

    def _degraded_nodes(self) -> list[str]:
        limit = 1.0 - self.policy.outlier
        return sorted(n for n, score in self._node_scores().items() if score < limit)

    def _inter_groups(self, *, exclude: set[str]) -> dict[tuple[str, str], list[float]]:
        groups: dict[tuple[str, str], list[float]] = {}
        for (a, b), fig in self._figures.items():
            if self.rack_of[a] != self.rack_of[b] and a not in exclude and b not in exclude:
                groups.setdefault(rack_group(self.rack_of, a, b), []).append(fig.bandwidth)
        return groups

    def _degraded_uplinks(self, degraded: set[str]) -> list[str]:
        """Racks whose pairs of racks (each one vote; slow NICs aside) sit below the cross-rack reference."""
        refs = self._reference()
        if not refs[1]:
            return []
        groups = self._inter_groups(exclude=degraded)
        per_rack: dict[str, list[float]] = {}
        for (ra, rb), values in groups.items():
            ratio = statistics.median(values) / refs[1]
            per_rack.setdefault(ra, []).append(ratio)
            per_rack.setdefault(rb, []).append(ratio)
        limit = 1.0 - self.policy.outlier
        return sorted(r for r, ratios in per_rack.items() if statistics.median(ratios) < limit)

    def findings(self) -> Findings:
        """Nodes slow with every peer (their NIC), racks slow with every other rack (their uplink), and single
        slow pairs that neither explains (a cable, a port)."""
        limit = 1.0 - self.policy.outlier
        degraded = self._degraded_nodes()
        uplinks = self._degraded_uplinks(set(degraded))
        refs = self._reference()
        cables: list[Pair] = []
        for a, b in sorted(self._figures):
            ratio = self._ratio(a, b, refs)
            if ratio is None or ratio >= limit or a in degraded or b in degraded:
                continue
            if self.rack_of[a] == self.rack_of[b] or not {self.rack_of[a], self.rack_of[b]} & set(uplinks):
                cables.append((a, b))
        return Findings(tuple(degraded), tuple(uplinks), tuple(cables))

    def matrix(self) -> SampledMatrix:
        """Every pair: measured where probed, else inferred from its group (slow NICs left out of the medians)."""
        return infer_matrix(self.rack_of, self._figures, unreliable=set(self._degraded_nodes()))


def infer_pairs(rack_of: Mapping[str, str], measured: Iterable[tuple[str, str, float, float]]) -> SampledMatrix:
    """The mixed matrix from stored measurements (node a, node b, GB/s, µs): what a finished sparse round
    leaves, read back without its sampler. Pairs naming a node outside ``rack_of`` are left out."""
    sampler = PairSampler(rack_of)
    for a, b, bandwidth, latency in measured:
        if a in rack_of and b in rack_of and a != b:
            sampler._planned.add(_key(a, b))
            sampler.record(a, b, bandwidth, latency)
    return sampler.matrix()


def pair_rounds(pairs: Iterable[Pair]) -> list[list[Pair]]:
    """Pack pairs into rounds of disjoint pairs (a node probes one peer at a time), greedily: pairs of the
    busiest nodes first, each into the first round in which both its nodes are free."""
    pairs = list(pairs)
    degree: dict[str, int] = {}
    for a, b in pairs:
        degree[a] = degree.get(a, 0) + 1
        degree[b] = degree.get(b, 0) + 1
    busy: dict[str, int] = {}
    rounds: list[list[Pair]] = []
    for a, b in sorted(pairs, key=lambda p: -max(degree[p[0]], degree[p[1]])):
        taken = busy.get(a, 0) | busy.get(b, 0)
        free = ~taken & (taken + 1)  # lowest clear bit
        slot = free.bit_length() - 1
        while len(rounds) <= slot:
            rounds.append([])
        rounds[slot].append((a, b))
        busy[a] = busy.get(a, 0) | free
        busy[b] = busy.get(b, 0) | free
    return rounds
