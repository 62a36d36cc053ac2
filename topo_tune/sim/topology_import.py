"""Build a simulator :class:`~topo_tune.sim.cluster.Cluster` from the agents' ``NodeTopology`` messages.

The wire messages say what discovery saw (GPUs, GPU-GPU links, NICs); racks and the spine are not
discoverable, so the caller supplies them (from ``cluster.yaml`` or the topology model). Missing
hardware facts fall back to documented defaults, logged with the node's name.

Non-goal: the controller's richer cluster model (fingerprints, probes bookkeeping); this is only the
bridge into the simulator.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from topo_tune.errors import SimInputError
from topo_tune.sim.cluster import (
    Cluster,
    FabricKind,
    GpuProfile,
    IntraNodeFabric,
    Nic,
    Node,
    NodePairMeasurement,
    SpineTier,
    Transport,
)
from topo_tune.sim.profiles import H100_SXM, H200_SXM_VM, PCIE_GPU
from topo_tune.v1 import topology_pb2

log = logging.getLogger(__name__)

# NVLink 3/4 lane bonds carry 25 GB/s per direction per link (H100: 18 links = 450 GB/s).
NVLINK_GBS_PER_LINK = 25.0
# PCIe payload rate per lane and direction, GB/s, by generation.
_PCIE_LANE_GBS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}
_DEFAULT_PCIE_GBS = 25.0
_DEFAULT_NIC_GBPS = 100.0
# Architectures whose NVSwitch systems offer NVLink SHARP.
_NVLS_ARCHS = frozenset({"sm_90", "sm_100", "sm_103"})


def cluster_from_topologies(
    topologies: Sequence[topology_pb2.NodeTopology],
    *,
    racks: Mapping[str, str],
    spine: SpineTier | None = None,
    rail_optimized: bool = True,
    measured: Sequence[NodePairMeasurement] = (),
    profile: GpuProfile | None = None,
    name: str = "",
) -> Cluster:
    """A cluster of the given nodes; ``racks`` maps each hostname to its rack.

    ``profile`` overrides the calibration picked from the GPU name (H100/H200 class, VM or not, or a
    PCIe part).
    """
    nodes = []
    for i, topo in enumerate(topologies):
        field = f"topologies[{i}]"
        if not topo.hostname:
            raise SimInputError(f"{field}.hostname", "must not be empty")
        if topo.hostname not in racks:
            raise SimInputError("racks", f"no rack for node {topo.hostname!r}")
        if not topo.gpus:
            raise SimInputError(f"{field}.gpus", f"node {topo.hostname!r} reports no GPU")
        nodes.append(
            Node(
                name=topo.hostname,
                rack=racks[topo.hostname],
                gpus=len(topo.gpus),
                fabric=fabric_of(topo),
                nics=nics_of(topo),
                profile=profile or profile_of(topo),
            )
        )
    return Cluster(
        nodes=tuple(nodes),
        spine=spine,
        rail_optimized=rail_optimized,
        measured=tuple(measured),
        name=name,
    )


def fabric_of(topo: topology_pb2.NodeTopology) -> IntraNodeFabric:
    """The GPU fabric: NVSwitch when NVLinks land on switches, direct NVLink, or PCIe."""
    nvlinks = [link for link in topo.gpu_links if link.kind == topology_pb2.LINK_KIND_NVLINK]
    if nvlinks:
        first = min(gpu.index for gpu in topo.gpus)
        if any(link.via_nvswitch for link in nvlinks):
            # Every GPU's links go to the switches, so any pair shows the GPU's full link count (NV18).
            links = max(link.nvlink_count for link in nvlinks if link.HasField("nvlink_count"))
            nvls = _arch(topo) in _NVLS_ARCHS and not topo.virtualized
            return IntraNodeFabric(kind=FabricKind.NVSWITCH, bandwidth_gbs=links * NVLINK_GBS_PER_LINK, nvls=nvls)
        links = sum(
            link.nvlink_count for link in nvlinks if first in (link.gpu_a, link.gpu_b) and link.HasField("nvlink_count")
        )
        return IntraNodeFabric(kind=FabricKind.NVLINK, bandwidth_gbs=max(1, links) * NVLINK_GBS_PER_LINK)
    gpu = topo.gpus[0]
    if gpu.HasField("pcie_gen_current") and gpu.HasField("pcie_width_current") and gpu.pcie_width_current:
        gbs = _PCIE_LANE_GBS.get(gpu.pcie_gen_current, _PCIE_LANE_GBS[4]) * gpu.pcie_width_current
    else:
        log.warning("node %s: PCIe link unknown, assuming %.0f GB/s", topo.hostname, _DEFAULT_PCIE_GBS)
        gbs = _DEFAULT_PCIE_GBS
    return IntraNodeFabric(kind=FabricKind.PCIE, bandwidth_gbs=gbs)


def nics_of(topo: topology_pb2.NodeTopology) -> tuple[Nic, ...]:
    """The NICs NCCL would use: active RDMA devices, else plain Ethernet for the socket transport."""
    usable = [nic for nic in topo.nics if nic.port_state.upper() not in ("DOWN", "INIT")]
    rdma = [
        nic
        for nic in usable
        if nic.link_layer in (topology_pb2.NIC_LINK_LAYER_INFINIBAND, topology_pb2.NIC_LINK_LAYER_ROCE)
    ]
    chosen = rdma or [nic for nic in usable if nic.link_layer == topology_pb2.NIC_LINK_LAYER_ETHERNET]
    out = []
    for rail, nic in enumerate(chosen):
        if nic.HasField("rate_gbps") and nic.rate_gbps > 0:
            rate = nic.rate_gbps
        else:
            log.warning("node %s: NIC %s rate unknown, assuming %.0f Gb/s", topo.hostname, nic.name, _DEFAULT_NIC_GBPS)
            rate = _DEFAULT_NIC_GBPS
        if nic.link_layer == topology_pb2.NIC_LINK_LAYER_INFINIBAND:
            transport = Transport.IB
        elif nic.link_layer == topology_pb2.NIC_LINK_LAYER_ROCE:
            transport = Transport.ROCE
        else:
            transport = Transport.SOCKET
        out.append(Nic(name=nic.name, line_rate_gbps=rate, rail=rail, transport=transport))
    return tuple(out)


def profile_of(topo: topology_pb2.NodeTopology) -> GpuProfile:
    """The calibration that fits this node's GPUs best."""
    names = " ".join(gpu.name for gpu in topo.gpus).upper()
    has_nvlink = any(link.kind == topology_pb2.LINK_KIND_NVLINK for link in topo.gpu_links)
    if not has_nvlink and len(topo.gpus) > 1:
        return PCIE_GPU
    if "H200" in names and topo.virtualized:
        return H200_SXM_VM
    return H100_SXM


def _arch(topo: topology_pb2.NodeTopology) -> str:
    for gpu in topo.gpus:
        if gpu.HasField("sm_arch"):
            return gpu.sm_arch
    names = " ".join(gpu.name for gpu in topo.gpus).upper()
    return "sm_90" if ("H100" in names or "H200" in names) else ""
