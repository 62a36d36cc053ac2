"""Rank maps and hostfiles: the optimizer's node ring turned into something a launcher uses.

Purpose: NCCL's inter-node ring follows the order of each node's lowest rank, so the way to impose a ring is to
hand out ranks node by node in ring order, contiguous on each node (NCCL_FACTS §2.5). This module plans that
order from a node-pair matrix and writes it as a JSON rank map and as hostfiles for Open MPI, Slurm
(``--distribution=arbitrary``) and torchrun (``--node_rank`` per host), each with the predicted ring bottleneck
next to the naive order's. The JSON also carries the pair matrix the ring was planned on (``pair_matrix``, up to
`PAIR_MATRIX_MAX_NODES` nodes), so that a job on part of the nodes can be given the best ring over its own nodes
(``job_order``). Non-goals: launching jobs; intra-node GPU order (see `gpu_ring`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.ring.model import Ring, ring_metrics
from topo_tune.tuner.ring.optimizer import optimize_ring

HostfileFlavour = Literal["mpi", "slurm", "torchrun"]
RANK_MAP_VERSION = 1
PAIR_MATRIX_MAX_NODES = 160
"""Largest matrix a rank map carries: 160 nodes make 12,720 pairs, about 300 KB of the version's 1 MiB per file."""
SOURCE_CODES = {"measured": "m", "inferred": "i", "modelled": "d", "given": "g"}
"""One letter per pair in ``pair_matrix.sources``: where its figures came from."""


@dataclass(frozen=True)
class RingPrediction:
    order: tuple[str, ...]
    bottleneck_gbps: float
    total_latency_us: float


@dataclass(frozen=True)
class RankMap:
    """Nodes in ring order with their GPU counts, and the predicted ring next to the naive one."""

    planned: RingPrediction
    naive: RingPrediction
    slots: Mapping[str, int]
    method: str
    pairs: PairMatrix | None = None
    """The matrix the rings were predicted from: each ring edge says whether its pair was measured, inferred
    from the rack model (sparse probing) or modelled, and the JSON counts each kind."""
    racks: Mapping[str, str] = field(default_factory=dict)
    """node → rack, carried with the matrix: a re-planned ring breaks bottleneck ties by fewest rack crossings."""
    tiers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """node → the tiers above its rack, top first, carried likewise: a higher tier's crossings count first."""

    def ranks(self) -> list[tuple[int, str, int]]:
        """(global rank, node, local rank) for every GPU, node by node in ring order."""
        out = []
        rank = 0
        for node in self.planned.order:
            for local in range(self.slots[node]):
                out.append((rank, node, local))
                rank += 1
        return out

    def to_json(self) -> str:
        def pred(p: RingPrediction) -> dict[str, object]:
            # One node has no inter-node ring: its bottleneck is null rather than an invalid "Infinity".
            finite = math.isfinite(p.bottleneck_gbps)
            return {
                "node_order": list(p.order),
                "ring_bottleneck_gbps": round(p.bottleneck_gbps, 6) if finite else None,
                "ring_latency_us": round(p.total_latency_us, 6),
            }

        payload: dict[str, object] = {
            "version": RANK_MAP_VERSION,
            "method": self.method,
            "world_size": sum(self.slots[n] for n in self.planned.order),
            "planned": pred(self.planned),
            "naive": pred(self.naive),
            "ranks": [{"rank": r, "node": n, "local_rank": lr} for r, n, lr in self.ranks()],
        }
        if self.pairs is not None:
            pairs = self.pairs
            for key, prediction in (("planned", self.planned), ("naive", self.naive)):
                order = prediction.order
                edges = [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))] if len(order) > 1 else []
                entry = payload[key]
                assert isinstance(entry, dict)
                entry["edges"] = [
                    {
                        "node_a": a,
                        "node_b": b,
                        "bandwidth_gbps": round(pairs.get(a, b).bandwidth_gbps, 6),
                        "source": pairs.get(a, b).source,
                    }
                    for a, b in (edges[:1] if len(order) == 2 else edges)
                ]
            counts: dict[str, int] = {}
            for estimate in pairs.estimates.values():
                counts[estimate.source] = counts.get(estimate.source, 0) + 1
            payload["pairs"] = dict(sorted(counts.items()))
            if len(pairs.names) <= PAIR_MATRIX_MAX_NODES:
                payload["pair_matrix"] = pair_matrix_json(pairs, self.racks, self.tiers)
        return json.dumps(payload, indent=2) + "\n"

    def hostfile(self, flavour: HostfileFlavour) -> str:
        if math.isfinite(self.planned.bottleneck_gbps):
            head = (
                f"# topo-tune ring order: predicted bottleneck {self.planned.bottleneck_gbps:.2f} GB/s "
                f"(naive order {self.naive.bottleneck_gbps:.2f} GB/s; {self._edge_sources()})\n"
            )
        else:
            head = "# topo-tune ring order: one node, no inter-node ring\n"
        return head + hostfile_body(flavour, self.planned.order, self.slots)

    def _edge_sources(self) -> str:
        """Where the planned ring's edge figures came from, so that a modelled prediction never reads as measured."""
        if self.pairs is None:
            return "where its pair figures came from is not recorded"
        order = self.planned.order
        edges = [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))][: 1 if len(order) == 2 else None]
        counts: dict[str, int] = {}
        for a, b in edges:
            source = self.pairs.get(a, b).source
            counts[source] = counts.get(source, 0) + 1
        kinds = ", ".join(f"{n} {source}" for source, n in sorted(counts.items()))
        return f"ring edges: {kinds}"


def hostfile_body(flavour: HostfileFlavour, order: Sequence[str], slots: Mapping[str, int] | int) -> str:
    """The hostfile lines for nodes in ``order`` with ``slots`` ranks each (a count per node, or one for all)."""
    per_node = dict.fromkeys(order, slots) if isinstance(slots, int) else slots
    if flavour == "mpi":
        # Open MPI's sequential mapper: one line per rank, in rank order. "HOST slots=N" lines would leave the
        # order to the default by-slot mapper, which starts on the node mpirun runs on (the real-launcher tests
        # saw ranks c,a,b,d,e for the order a..e launched from c); Open MPI skips the comment.
        ranks = sum(per_node[node] for node in order)
        usage = f"# mpirun --mca rmaps seq --hostfile THIS_FILE -np {ranks}: one line per rank, in rank order\n"
        return usage + "".join(f"{node}\n" * per_node[node] for node in order)
    if flavour == "slurm":
        # SLURM_HOSTFILE for srun --distribution=arbitrary: one line per task, in rank order.
        return "".join(f"{node}\n" * per_node[node] for node in order)
    if flavour == "torchrun":
        # torchrun --node_rank=N on each host; rank = node_rank * nproc_per_node + local_rank.
        return "".join(f"{node} {index}\n" for index, node in enumerate(order))
    raise ValueError(f"hostfile flavour must be mpi, slurm or torchrun, got {flavour!r}")


def pair_matrix_json(
    pairs: PairMatrix, racks: Mapping[str, str], tiers: Mapping[str, tuple[str, ...]] | None = None
) -> dict[str, object]:
    """The matrix over its nodes sorted by name, as upper-triangle rows: row i holds the pairs (i, j > i); the
    racks and the tiers above them (per node, top first) where known."""
    names = sorted(pairs.names)
    rows = [[pairs.get(a, b) for b in names[i + 1 :]] for i, a in enumerate(names)]
    data: dict[str, object] = {
        "nodes": names,
        "bandwidth_gbps": [[round(e.bandwidth_gbps, 4) for e in row] for row in rows[:-1]],
        "latency_us": [[round(e.latency_us, 4) for e in row] for row in rows[:-1]],
        "sources": ["".join(SOURCE_CODES.get(e.source, "d") for e in row) for row in rows[:-1]],
    }
    if racks:
        data["racks"] = [racks.get(n, "") for n in names]
    if tiers and any(tiers.values()):
        data["tiers"] = [list(tiers.get(n, ())) for n in names]
    return data


def plan_rank_map(
    pairs: PairMatrix,
    *,
    slots: Mapping[str, int] | int,
    naive_order: Sequence[str] | None = None,
    rack_of: Mapping[str, str] | None = None,
    tiers_of: Mapping[str, tuple[str, ...]] | None = None,
    seed: int = 0,
) -> RankMap:
    """Order ``pairs.names`` into the best ring and compare it with ``naive_order`` (default: the given order).
    ``tiers_of``: node → the tiers above its rack, top first (`optimize_ring`'s ``tiers``).

    The planned ring is rotated to start at the naive order's first node, so rank 0 stays where it was.
    """
    names = list(pairs.names)
    naive = list(naive_order) if naive_order is not None else names
    if sorted(naive) != sorted(names):
        raise ValueError("naive_order must list exactly the nodes of the pair matrix")
    counts = dict.fromkeys(names, slots) if isinstance(slots, int) else dict(slots)
    missing = [n for n in names if n not in counts]
    if missing:
        raise ValueError(f"slots: no GPU count for node(s) {', '.join(missing)}")
    for node, count in counts.items():
        if count < 1:
            raise ValueError(f"slots[{node!r}] must be at least 1, got {count}")
    bw, lat = pairs.bandwidth(), pairs.latency()
    racks = [rack_of.get(n, "") for n in names] if rack_of is not None else None
    tiers = [tiers_of.get(n, ()) for n in names] if tiers_of else None
    ring: Ring = optimize_ring(bw, lat, racks=racks, tiers=tiers, seed=seed)
    order = [names[i] for i in ring.order]
    if order:
        start = order.index(naive[0])
        order = order[start:] + order[:start]
    index = {n: i for i, n in enumerate(names)}
    naive_b, naive_l = ring_metrics([index[n] for n in naive], bw, lat)
    return RankMap(
        planned=RingPrediction(tuple(order), ring.bottleneck_gbps, ring.total_latency_us),
        naive=RingPrediction(tuple(naive), naive_b, naive_l),
        slots=counts,
        method=ring.method,
        pairs=pairs,
        racks={n: r for n, r in (rack_of or {}).items() if n in index},
        tiers={n: tuple(t) for n, t in (tiers_of or {}).items() if n in index and t},
    )
