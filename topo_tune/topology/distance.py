"""The distance and bandwidth model: per GPU pair inside a node, per node pair across the cluster.

Units: every bandwidth here is in GB/s (10^9 bytes per second, as NCCL reports bus bandwidth) although the
names say ``gbps``; NIC rates in a `NodeTopology` are Gb/s and are divided by 8 on the way in.

Purpose: give the ring-order optimizer and the ``sim`` backend a bandwidth matrix, a latency matrix and the logical
distance ``d = α·hops + β/bandwidth + γ·crossNUMA`` for every pair. Modelled values come from link kinds and
nominal rates; a value measured by a probe replaces the modelled one and carries when and how it was measured.
Non-goals: running probes (the benchmark side does) and NCCL's own algorithm model.

Default weights (`DistanceWeights`), chosen so that ``d`` reads as microseconds for a 1 MB message:
  α = 0.5 µs per hop (a switch or bridge traversal costs a few hundred ns),
  β = 1000 µs·GB/s (1 MB at ``bandwidth`` GB/s takes 1000/bandwidth µs),
  γ = 1.0 µs per NUMA crossing (a UPI/Infinity-Fabric hop plus the bandwidth it steals).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from topo_tune.v1 import topology_pb2

# Per-direction rate of one NVLink by GPU generation, GB/s (NVLink 2/3/4 all move 25 GB/s per link per
# direction; an H200 measured 26.56 in `nvidia-smi nvlink -s`). Blackwell's NVLink 5 doubles it.
_NVLINK_GBPS = {"sm_70": 25.0, "sm_80": 25.0, "sm_86": 14.0, "sm_90": 25.0, "sm_100": 50.0}
_NVLINK_DEFAULT = 20.0
# Usable share of a PCIe link's raw rate (TLP/DLLP overhead; what P2P copies reach in practice).
_PCIE_EFFICIENCY = 0.8
_PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# Extra loss of a path that crosses the CPU's host bridge / its interconnect.
_PCIE_PATH_FACTOR = {
    topology_pb2.LINK_KIND_PIX: 1.0,
    topology_pb2.LINK_KIND_PXB: 1.0,
    topology_pb2.LINK_KIND_PHB: 0.9,
    topology_pb2.LINK_KIND_NODE: 0.8,
    topology_pb2.LINK_KIND_SYS: 0.5,
}
_HOPS = {
    topology_pb2.LINK_KIND_SELF: 0,
    topology_pb2.LINK_KIND_NVLINK: 1,
    topology_pb2.LINK_KIND_PIX: 2,
    topology_pb2.LINK_KIND_PXB: 4,
    topology_pb2.LINK_KIND_PHB: 4,
    topology_pb2.LINK_KIND_NODE: 6,
    topology_pb2.LINK_KIND_SYS: 8,
}
_UNKNOWN_HOPS = 8
_HOP_LATENCY_US = 0.25


@dataclass(frozen=True)
class DistanceWeights:
    """Weights of ``d = α·hops + β/bandwidth + γ·crossNUMA`` (see the module docstring for the defaults)."""

    alpha_per_hop: float = 0.5
    beta: float = 1000.0
    gamma_cross_numa: float = 1.0

    def distance(self, *, hops: int, bandwidth_gbps: float, cross_numa: bool) -> float:
        if bandwidth_gbps <= 0:
            return float("inf")
        return self.alpha_per_hop * hops + self.beta / bandwidth_gbps + self.gamma_cross_numa * cross_numa


@dataclass(frozen=True)
class Measurement:
    """A probe's figure for one pair; it replaces the modelled value."""

    bandwidth_gbps: float
    latency_us: float
    measured_at: datetime
    method: str  # e.g. "nccl-tests sendrecv_perf busbw @ 256 MiB"

    def __post_init__(self) -> None:
        if self.bandwidth_gbps <= 0:
            raise ValueError(f"bandwidth_gbps must be positive, got {self.bandwidth_gbps}")
        if self.latency_us < 0:
            raise ValueError(f"latency_us must not be negative, got {self.latency_us}")


@dataclass(frozen=True)
class PairEstimate:
    """What the model says about one pair, and where the figures come from."""

    bandwidth_gbps: float
    latency_us: float
    hops: int
    cross_numa: bool
    distance: float
    source: Literal["modelled", "measured", "given", "inferred"] = "modelled"
    measured_at: datetime | None = None
    method: str = ""


@dataclass(frozen=True)
class PairMatrix:
    """Symmetric per-pair estimates over ``names`` (GPUs of a node, or nodes of a cluster)."""

    names: tuple[str, ...]
    estimates: Mapping[tuple[str, str], PairEstimate]
    weights: DistanceWeights = field(default_factory=DistanceWeights)

    @classmethod
    def from_matrices(
        cls,
        names: Sequence[str],
        bandwidth: Sequence[Sequence[float]],
        latency: Sequence[Sequence[float]] | None = None,
        *,
        method: str,
        weights: DistanceWeights | None = None,
    ) -> PairMatrix:
        """Pairs given directly (an operator's file, another tool's output); ``method`` says where from.
        Raises ValueError naming the first entry that does not fit."""
        w = weights or DistanceWeights()
        n = len(names)
        if len(set(names)) != n:
            raise ValueError("names must be unique")
        if len(bandwidth) != n or any(len(row) != n for row in bandwidth):
            raise ValueError(f"bandwidth must be {n}x{n} for {n} names")
        if latency is not None and (len(latency) != n or any(len(row) != n for row in latency)):
            raise ValueError(f"latency must be {n}x{n} for {n} names")
        estimates: dict[tuple[str, str], PairEstimate] = {}
        for i in range(n):
            for j in range(i + 1, n):
                rate = float(bandwidth[i][j])
                lat = float(latency[i][j]) if latency is not None else 0.0
                if rate <= 0 or rate != float(bandwidth[j][i]):
                    raise ValueError(f"bandwidth[{i}][{j}] must be positive and equal to bandwidth[{j}][{i}]")
                if latency is not None and (lat < 0 or lat != float(latency[j][i])):
                    raise ValueError(f"latency[{i}][{j}] must be >= 0 and equal to latency[{j}][{i}]")
                estimates[(names[i], names[j])] = PairEstimate(
                    bandwidth_gbps=rate,
                    latency_us=lat,
                    hops=0,
                    cross_numa=False,
                    distance=w.distance(hops=0, bandwidth_gbps=rate, cross_numa=False),
                    source="given",
                    method=method,
                )
        return cls(names=tuple(names), estimates=estimates, weights=w)

    def get(self, a: str, b: str) -> PairEstimate:
        key = (a, b) if (a, b) in self.estimates else (b, a)
        try:
            return self.estimates[key]
        except KeyError:
            raise KeyError(f"no estimate for the pair {a!r}, {b!r}") from None

    def with_measurement(self, a: str, b: str, measurement: Measurement) -> PairMatrix:
        """A copy in which the measured figures replace the modelled ones for this pair."""
        if a not in self.names or b not in self.names:
            raise KeyError(f"unknown pair {a!r}, {b!r}")
        old = self.get(a, b)
        new = replace(
            old,
            bandwidth_gbps=measurement.bandwidth_gbps,
            latency_us=measurement.latency_us,
            distance=self.weights.distance(
                hops=old.hops, bandwidth_gbps=measurement.bandwidth_gbps, cross_numa=old.cross_numa
            ),
            source="measured",
            measured_at=measurement.measured_at,
            method=measurement.method,
        )
        estimates = dict(self.estimates)
        estimates.pop((b, a), None)
        estimates[(a, b)] = new
        return replace(self, estimates=estimates)

    def reordered(self, names: Sequence[str]) -> PairMatrix:
        """The same pairs over ``names`` in this order (the same set of names)."""
        if sorted(names) != sorted(self.names):
            raise ValueError("reordered: names must be the matrix's own")
        return replace(self, names=tuple(names))

    def bandwidth(self) -> list[list[float]]:
        """Bandwidth matrix (GB/s); the diagonal is infinite (a device to itself)."""
        return [[float("inf") if a == b else self.get(a, b).bandwidth_gbps for b in self.names] for a in self.names]

    def latency(self) -> list[list[float]]:
        return [[0.0 if a == b else self.get(a, b).latency_us for b in self.names] for a in self.names]


def pcie_gbps(gen: int | None, width: int | None) -> float | None:
    """Usable one-direction PCIe bandwidth in GB/s, None when generation or width is unknown."""
    if gen is None or width is None or gen not in _PCIE_LANE_GBPS or width <= 0:
        return None
    return _PCIE_LANE_GBPS[gen] * width * _PCIE_EFFICIENCY


def _gpu_pcie(gpu: topology_pb2.Gpu) -> float | None:
    gen = gpu.pcie_gen_max if gpu.HasField("pcie_gen_max") else None
    width = gpu.pcie_width_max if gpu.HasField("pcie_width_max") else None
    return pcie_gbps(gen, width)


def gpu_pair_matrix(
    topo: topology_pb2.NodeTopology,
    *,
    weights: DistanceWeights | None = None,
    unknown_pcie_gbps: float = 12.0,
) -> PairMatrix:
    """Model every GPU pair of one node. A PCIe rate NVML could not give falls back to ``unknown_pcie_gbps``
    (PCIe 3 ×16 usable, the slowest link still common in GPU servers), so an unknown never looks fast."""
    w = weights or DistanceWeights()
    gpus = {g.index: g for g in topo.gpus}
    names = tuple(f"GPU{i}" for i in sorted(gpus))
    estimates: dict[tuple[str, str], PairEstimate] = {}
    for link in topo.gpu_links:
        a, b = gpus.get(link.gpu_a), gpus.get(link.gpu_b)
        if a is None or b is None:
            continue
        cross = a.HasField("numa_node") and b.HasField("numa_node") and a.numa_node != b.numa_node
        if link.kind == topology_pb2.LINK_KIND_NVLINK:
            rate = _NVLINK_GBPS.get(a.sm_arch, _NVLINK_DEFAULT) * (link.nvlink_count or 1)
            hops = 2 if link.via_nvswitch else 1
            cross = False  # NVLink does not go through the CPU
        else:
            pcie = [x for x in (_gpu_pcie(a), _gpu_pcie(b)) if x is not None]
            base = min(pcie) if pcie else unknown_pcie_gbps
            rate = base * _PCIE_PATH_FACTOR.get(link.kind, _PCIE_PATH_FACTOR[topology_pb2.LINK_KIND_SYS])
            hops = _HOPS.get(link.kind, _UNKNOWN_HOPS)
        estimates[(f"GPU{a.index}", f"GPU{b.index}")] = PairEstimate(
            bandwidth_gbps=rate,
            latency_us=_HOP_LATENCY_US * hops + 1.0,  # ~1 µs of fixed send/receive cost per transfer
            hops=hops,
            cross_numa=cross,
            distance=w.distance(hops=hops, bandwidth_gbps=rate, cross_numa=cross),
        )
    return PairMatrix(names=names, estimates=estimates, weights=w)


def node_injection_gbps(topo: topology_pb2.NodeTopology) -> float | None:
    """What a node can push into the fabric: the sum of its active RDMA NICs (GB/s), else its fastest NIC."""
    rdma = [
        n.rate_gbps / 8.0
        for n in topo.nics
        if n.HasField("rate_gbps")
        and n.link_layer in (topology_pb2.NIC_LINK_LAYER_INFINIBAND, topology_pb2.NIC_LINK_LAYER_ROCE)
        and n.port_state.upper() in ("ACTIVE", "UP", "")
    ]
    if rdma:
        return sum(rdma)
    rates = [n.rate_gbps / 8.0 for n in topo.nics if n.HasField("rate_gbps")]
    return max(rates) if rates else None


def node_pair_matrix(
    nodes: Sequence[str],
    *,
    injection_gbps: Mapping[str, float | None],
    rack_of: Mapping[str, str],
    tiers_of: Mapping[str, Sequence[str]] | None = None,
    spine_oversubscription: float = 1.0,
    spine_gbps: float | None = None,
    unknown_injection_gbps: float = 1.25,
    weights: DistanceWeights | None = None,
) -> PairMatrix:
    """Model every node pair: same rack = leaf switch only (2 hops), other racks = leaf-spine-leaf (4 hops) at
    ``1/spine_oversubscription`` of the endpoints' rate, capped at ``spine_gbps`` (Gb/s, like NIC rates) when
    given. ``injection_gbps`` is in GB/s (see `node_injection_gbps`). An unknown NIC rate counts as 10 GbE.

    ``tiers_of`` (node → the tiers above its rack, top first, e.g. spine then block): two switch hops more
    for each tier the pair must climb above the rack (other racks of one block: 4 hops; other blocks of one
    spine: 6), so a path across a higher tier costs more latency. The rate across racks stays the spine's:
    nothing says how much less a higher tier gives, so the model does not guess."""
    if spine_oversubscription < 1.0:
        raise ValueError(f"spine_oversubscription must be >= 1, got {spine_oversubscription}")
    w = weights or DistanceWeights()
    estimates: dict[tuple[str, str], PairEstimate] = {}
    for i, a in enumerate(nodes):
        for b in nodes[i + 1 :]:
            rate = min(injection_gbps.get(a) or unknown_injection_gbps, injection_gbps.get(b) or unknown_injection_gbps)
            same_rack = rack_of.get(a) == rack_of.get(b)
            hops = 2 if same_rack else 4 + 2 * _tiers_parted(tiers_of, a, b)
            if not same_rack:
                rate /= spine_oversubscription
                if spine_gbps is not None:
                    rate = min(rate, spine_gbps / 8.0)
            estimates[(a, b)] = PairEstimate(
                bandwidth_gbps=rate,
                latency_us=2.0 + 0.6 * hops,  # NIC + per-switch cut-through latency on IB/RoCE fabrics
                hops=hops,
                cross_numa=False,
                distance=w.distance(hops=hops, bandwidth_gbps=rate, cross_numa=False),
            )
    return PairMatrix(names=tuple(nodes), estimates=estimates, weights=w)


def _tiers_parted(tiers_of: Mapping[str, Sequence[str]] | None, a: str, b: str) -> int:
    """How many tiers above their racks two nodes in different racks climb to meet: 0 when they share the tier
    directly above (one block), 1 when they share only the one above that, and so on (a tier a node does not
    name counts as shared)."""
    if not tiers_of:
        return 0
    above_a, above_b = tuple(tiers_of.get(a, ())), tuple(tiers_of.get(b, ()))
    depth = min(len(above_a), len(above_b))
    above_a, above_b = above_a[len(above_a) - depth :], above_b[len(above_b) - depth :]
    return next((depth - level for level in range(depth) if above_a[level] != above_b[level]), 0)
