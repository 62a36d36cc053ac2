"""The size-independent part of the model for one (cluster, rank order, environment): a ``CollectivePlan``.

Purpose: the job's shape (nodes, GPUs per node, ranks), its intra-node ceiling, NVLS and LL128
availability, channels and threads after the knobs, and the true and nominal network views, computed
once and reused for every size of a sweep.

Non-goals: timing a message (``model``), the network's arithmetic (``network``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topo_tune.errors import SimInputError
from topo_tune.nccl.collectives import Collective
from topo_tune.sim.cluster import Cluster, FabricKind, GpuProfile, Transport
from topo_tune.sim.knobs import MAX_CHANNELS, MAX_THREADS, Algorithm, NcclKnobs, Protocol
from topo_tune.sim.network import NetView, net_view


@dataclass(frozen=True)
class CollectivePlan:
    """Everything about one (cluster, rank order, environment) that does not depend on message size."""

    nodes: int
    gpus: int
    nranks: int
    profile: GpuProfile
    knobs: NcclKnobs
    intra_gbs: float  # NVLink/PCIe ring bus-bandwidth ceiling per GPU
    intra_hw: str  # "nvl" or "pci"
    nvls_gbs: float  # NVLS algorithm bandwidth, 0 if NVLS is unavailable or disabled
    ll128: bool
    channels: int  # channel count after NCCL_MIN/MAX_CTAS
    min_channels: int  # floor of NCCL's small-message channel reduction
    nthreads: int
    socket: bool
    actual: NetView | None
    nominal: NetView | None
    # The algorithm/protocol pairs NCCL may pick, per collective (filled on first use).
    candidates: dict[Collective, list[tuple[Algorithm, Protocol]]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )


def build_plan(cluster: Cluster, order: tuple[str, ...], knobs: NcclKnobs) -> CollectivePlan:
    """Precompute the size-independent part of the model for a job over ``order``'s nodes."""
    nodes = [cluster.node(name) for name in order]
    gpus = nodes[0].gpus
    for node in nodes:
        if node.gpus != gpus:
            # NCCL needs the same ranks per node (uneven counts deadlocked bootstrap, NVIDIA/nccl#2385).
            raise SimInputError("rank_order", f"node {node.name!r} has {node.gpus} GPUs, {nodes[0].name!r} has {gpus}")
    n = len(nodes)
    profile = nodes[0].profile
    fabric_kind = nodes[0].fabric.kind
    intra_line = min(node.fabric.bandwidth_gbs for node in nodes)
    intra_hw = "pci" if fabric_kind is FabricKind.PCIE else "nvl"
    if fabric_kind is FabricKind.NVLINK and gpus > 2:
        # Without a switch a ring's neighbour is reached over the links bonded to that one peer.
        intra_line /= 2
    intra_gbs = intra_line * profile.link_efficiency
    nvls = all(node.fabric.nvls for node in nodes) and gpus > 1 and knobs.nvls_enable != 0
    nvls_gbs = intra_line * profile.nvls_algbw_fraction if nvls else 0.0
    if knobs.algorithms is not None and not knobs.algorithms & {Algorithm.NVLS, Algorithm.NVLS_TREE}:
        nvls_gbs = 0.0
    # NCCL enables LL128 by default only where NVLink carries the ring (tuning.cc's platform gate).
    ll128 = fabric_kind is not FabricKind.PCIE or gpus == 1
    socket = any(node.transport is Transport.SOCKET for node in nodes) and n > 1
    nics = min(len(node.nics) for node in nodes)
    if n > 1 and nics == 0:
        raise SimInputError("rank_order", "a job over several nodes needs NICs on every node")
    default_channels = profile.ring_channels if n == 1 else min(MAX_CHANNELS, profile.channels_per_nic * nics)
    max_ctas = knobs.max_ctas if knobs.max_ctas is not None else MAX_CHANNELS
    min_ctas = min(knobs.min_ctas or 1, max_ctas)
    channels = max(min_ctas, min(max_ctas, default_channels))
    nthreads = knobs.nthreads or MAX_THREADS
    actual = nominal = None
    if n > 1:
        actual = net_view(cluster, nodes, knobs, channels, truth=True)
        nominal = net_view(cluster, nodes, knobs, channels, truth=False)
    return CollectivePlan(
        nodes=n,
        gpus=gpus,
        nranks=n * gpus,
        profile=profile,
        knobs=knobs,
        intra_gbs=intra_gbs,
        intra_hw=intra_hw,
        nvls_gbs=nvls_gbs,
        ll128=ll128,
        channels=channels,
        min_channels=min_ctas if knobs.min_ctas is not None else 1,
        nthreads=nthreads,
        socket=socket,
        actual=actual,
        nominal=nominal,
    )
