"""The cluster description the simulator computes over: nodes, their fabric and NICs, racks and the spine.

Everything is a frozen dataclass so a description can be shared between studies and threads. Units are
spelled in the field names: NIC line rates in Gb/s (bits, as sysfs ``rate`` and ``Nic.rate_gbps`` give
them), fabric and measured bandwidths in GB/s (bytes, as nccl-tests prints them).

Non-goals: discovering anything (see :mod:`topo_tune.sim.topology_import` for building one from
``NodeTopology`` messages) and modelling more than one switch tier above the racks.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from topo_tune.errors import SimInputError


class FabricKind(enum.Enum):
    """How the GPUs inside one node reach each other."""

    __hash__ = object.__hash__  # members are singletons; Enum's own __hash__ is slow

    NVSWITCH = "nvswitch"  # every GPU reaches every other at its full NVLink bandwidth
    NVLINK = "nvlink"  # direct NVLink bridges (no switch); a ring uses one link per GPU pair
    PCIE = "pcie"  # no NVLink: through PCIe switches or the host bridge


class Transport(enum.Enum):
    """How NCCL's network plugin moves data through a NIC."""

    __hash__ = object.__hash__  # members are singletons; Enum's own __hash__ is slow

    IB = "ib"  # InfiniBand verbs
    ROCE = "roce"  # verbs over Ethernet
    SOCKET = "socket"  # NCCL's TCP socket transport (no RDMA)


@dataclass(frozen=True)
class GpuProfile:
    """Calibration of one GPU/host type: how fast NCCL's kernels move data on it.

    The defaults are fitted in ``docs/sim.md``; presets live in :mod:`topo_tune.sim.profiles`.
    """

    name: str
    # One CTA (channel) with 512 threads and the Simple protocol: its copy/reduce rate.
    cta_gbs: float = 20.6
    # Fraction of the NVLink/PCIe line rate a ring's bus bandwidth reaches.
    link_efficiency: float = 0.844
    # Extra latency on every collective, e.g. a VM's slower doorbells and launches.
    launch_overhead_us: float = 0.0
    # Latency that fades as more CTAs are launched (seen on a VM: >=16 CTAs cut small-message time ~30%).
    small_msg_cta_penalty_us: float = 0.0
    # Launch and synchronisation cost of each CTA beyond the first.
    per_cta_us: float = 0.04
    # NCCL's ring channel count on one node, and channels per NIC across nodes (graph search result).
    ring_channels: int = 32
    channels_per_nic: int = 4
    # NVLink SHARP (NVLS) all_reduce: algorithm bandwidth as a fraction of NVLink line rate.
    nvls_algbw_fraction: float = 0.61
    # Run-to-run coefficient of variation of a large-message time (seeded noise).
    cv: float = 0.01

    def __post_init__(self) -> None:
        for name in ("cta_gbs", "link_efficiency", "nvls_algbw_fraction"):
            _positive(f"profile.{name}", getattr(self, name))
        for name in ("launch_overhead_us", "small_msg_cta_penalty_us", "per_cta_us", "cv"):
            if getattr(self, name) < 0:
                raise SimInputError(f"profile.{name}", "must not be negative")
        if not 1 <= self.ring_channels <= 64:
            raise SimInputError("profile.ring_channels", "must be within 1..64")
        if not 1 <= self.channels_per_nic <= 64:
            raise SimInputError("profile.channels_per_nic", "must be within 1..64")


@dataclass(frozen=True)
class IntraNodeFabric:
    """The GPU-to-GPU fabric of one node."""

    kind: FabricKind
    # Per GPU and direction, GB/s: NVLink aggregate (e.g. 18 x 25 = 450 on H100) or the PCIe link.
    bandwidth_gbs: float
    # NVLink SHARP (in-switch reductions) usable: NVSwitch gen3+ on bare metal.
    nvls: bool = False
    # One GPU-to-GPU hop, on top of NCCL's per-protocol step latency.
    hop_latency_us: float = 0.0

    def __post_init__(self) -> None:
        _positive("fabric.bandwidth_gbs", self.bandwidth_gbs)
        if self.nvls and self.kind is not FabricKind.NVSWITCH:
            raise SimInputError("fabric.nvls", "NVLS needs an NVSwitch fabric")


@dataclass(frozen=True)
class Nic:
    """One network interface NCCL uses."""

    name: str
    line_rate_gbps: float  # Gb/s (bits): 400 for NDR 4x
    rail: int = 0  # rail index: in a rail-optimized fabric only NICs of one rail share a leaf switch
    transport: Transport = Transport.IB

    def __post_init__(self) -> None:
        _positive(f"nic[{self.name}].line_rate_gbps", self.line_rate_gbps)


@dataclass(frozen=True)
class Node:
    """One GPU node."""

    name: str
    rack: str
    gpus: int
    fabric: IntraNodeFabric
    nics: tuple[Nic, ...]
    profile: GpuProfile

    def __post_init__(self) -> None:
        if not self.name:
            raise SimInputError("node.name", "must not be empty")
        if self.gpus < 1:
            raise SimInputError(f"node[{self.name}].gpus", "must be at least 1")
        if len({nic.name for nic in self.nics}) != len(self.nics):
            raise SimInputError(f"node[{self.name}].nics", "NIC names must be unique")

    @property
    def transport(self) -> Transport:
        """The transport NCCL uses between nodes: RDMA when every NIC offers it, else sockets."""
        if self.nics and all(nic.transport is not Transport.SOCKET for nic in self.nics):
            return self.nics[0].transport
        return Transport.SOCKET


@dataclass(frozen=True)
class RackPairBandwidth:
    """SpineTier capacity between two racks, GB/s per direction (overrides the oversubscription rule)."""

    rack_a: str
    rack_b: str
    bandwidth_gbs: float

    def __post_init__(self) -> None:
        _positive(f"rack_pair[{self.rack_a},{self.rack_b}].bandwidth_gbs", self.bandwidth_gbs)


@dataclass(frozen=True)
class RackUplink:
    """A rack whose uplink carries only ``share`` of its nominal capacity (failed or flapping spine links)."""

    rack: str
    share: float

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise SimInputError(f"uplinks[{self.rack}].share", f"must be within (0, 1], got {self.share!r}")


@dataclass(frozen=True)
class SpineTier:
    """The switch tier that joins the racks' leaf switches."""

    # Downlink to uplink ratio of a leaf: 4.0 means a rack's uplink carries a quarter of its NIC rates.
    oversubscription: float = 1.0
    # Equal-cost spine paths a leaf hashes flows over; collisions leave some idle (1 = no hashing loss).
    ecmp_paths: int = 1
    # Extra latency of a hop that crosses the spine.
    latency_us: float = 1.0
    rack_pairs: tuple[RackPairBandwidth, ...] = ()
    uplinks: tuple[RackUplink, ...] = ()

    def __post_init__(self) -> None:
        if self.oversubscription < 1.0:
            raise SimInputError("spine.oversubscription", "must be at least 1.0")
        if self.ecmp_paths < 1:
            raise SimInputError("spine.ecmp_paths", "must be at least 1")
        if self.latency_us < 0:
            raise SimInputError("spine.latency_us", "must not be negative")


@dataclass(frozen=True)
class NodePairMeasurement:
    """A probed node-to-node figure (both directions); it replaces the modelled NIC-to-NIC value."""

    node_a: str
    node_b: str
    bandwidth_gbs: float  # all rails together, GB/s
    latency_us: float

    def __post_init__(self) -> None:
        _positive(f"measured[{self.node_a},{self.node_b}].bandwidth_gbs", self.bandwidth_gbs)
        if self.latency_us < 0:
            raise SimInputError(f"measured[{self.node_a},{self.node_b}].latency_us", "must not be negative")


@dataclass(frozen=True)
class Cluster:
    """Nodes, racks and the network between them."""

    nodes: tuple[Node, ...]
    spine: SpineTier | None = None  # None: one non-blocking switch tier, racks do not matter
    # NICs of one rail share a leaf; traffic between rails must climb to the spine.
    rail_optimized: bool = True
    # A leaf-switch hop's latency (between nodes of one rack).
    switch_latency_us: float = 0.5
    measured: tuple[NodePairMeasurement, ...] = ()
    name: str = ""
    # Lookup tables and the simulator's per-cluster caches; not part of the value.
    _index: dict[str, Node] = field(init=False, repr=False, compare=False, hash=False)
    _uplink: dict[str, float] = field(init=False, repr=False, compare=False, hash=False)
    _pairs: dict[tuple[str, str], float] = field(init=False, repr=False, compare=False, hash=False)
    _measured: dict[tuple[str, str], NodePairMeasurement] = field(init=False, repr=False, compare=False, hash=False)
    _nic_class: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)
    cache: dict[Any, Any] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise SimInputError("cluster.nodes", "must not be empty")
        index: dict[str, Node] = {}
        for node in self.nodes:
            if node.name in index:
                raise SimInputError("cluster.nodes", f"node {node.name!r} appears twice")
            index[node.name] = node
        uplink: dict[str, float] = {}
        for node in self.nodes:
            nic_gbs = sum(nic.line_rate_gbps for nic in node.nics) / 8.0
            uplink[node.rack] = uplink.get(node.rack, 0.0) + nic_gbs
        if self.spine is not None:
            for rack in uplink:
                uplink[rack] /= self.spine.oversubscription
            for degraded in self.spine.uplinks:
                if degraded.rack not in uplink:
                    raise SimInputError("spine.uplinks", f"unknown rack {degraded.rack!r}")
                uplink[degraded.rack] *= degraded.share
        pairs: dict[tuple[str, str], float] = {}
        for pair in self.spine.rack_pairs if self.spine is not None else ():
            for rack in (pair.rack_a, pair.rack_b):
                if rack not in uplink:
                    raise SimInputError("spine.rack_pairs", f"unknown rack {rack!r}")
            pairs[(pair.rack_a, pair.rack_b)] = pair.bandwidth_gbs
            pairs[(pair.rack_b, pair.rack_a)] = pair.bandwidth_gbs
        measured: dict[tuple[str, str], NodePairMeasurement] = {}
        for m in self.measured:
            for name in (m.node_a, m.node_b):
                if name not in index:
                    raise SimInputError("cluster.measured", f"unknown node {name!r}")
            measured[(m.node_a, m.node_b)] = m
            measured[(m.node_b, m.node_a)] = m
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_uplink", uplink)
        object.__setattr__(self, "_pairs", pairs)
        object.__setattr__(self, "_measured", measured)
        classes: dict[tuple[tuple[Nic, ...], Transport], int] = {}
        nic_class = {n.name: classes.setdefault((n.nics, n.transport), len(classes)) for n in self.nodes}
        object.__setattr__(self, "_nic_class", nic_class)
        object.__setattr__(self, "cache", {})

    def node(self, name: str) -> Node:
        """The node called ``name``; :class:`SimInputError` if there is none."""
        try:
            return self._index[name]
        except KeyError:
            raise SimInputError("rank_order", f"unknown node {name!r}") from None

    @property
    def node_names(self) -> tuple[str, ...]:
        """Node names in the order the description lists them (NCCL's natural order for this cluster)."""
        return tuple(node.name for node in self.nodes)

    @property
    def racks(self) -> tuple[str, ...]:
        """Rack names, in order of first appearance."""
        return tuple(self._uplink)

    def rack_uplink_gbs(self, rack: str) -> float:
        """What one rack can send across the spine, GB/s per direction."""
        return self._uplink[rack] if self.spine is not None else math.inf

    def rack_pair_gbs(self, rack_a: str, rack_b: str) -> float:
        """SpineTier capacity between two racks if one was given, else infinity."""
        return self._pairs.get((rack_a, rack_b), math.inf)

    def nic_class(self, name: str) -> int:
        """Nodes with the same NICs (and so the same NIC model results) share a class number."""
        return self._nic_class[name]

    def measurement(self, node_a: str, node_b: str) -> NodePairMeasurement | None:
        """The probed figure between two nodes, if any."""
        return self._measured.get((node_a, node_b))


def _positive(field_name: str, value: float) -> None:
    if not value > 0 or math.isinf(value):
        raise SimInputError(field_name, f"must be a positive finite number, got {value!r}")
