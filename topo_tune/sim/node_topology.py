"""Simulated nodes' topologies: what a ``sim`` agent registers instead of discovering real hardware.

A ``sim`` agent stands for a GPU node that is not there. It registers a ``NodeTopology`` shaped like a
real one — GPUs, their NVLink/NVSwitch links, NICs with rates — so that the controller's cluster model,
``admin topology`` and the simulator (through ``cluster_from_topologies``) all see the same machine. The
topology says ``source = "simulated"`` so nothing mistakes it for discovered hardware.

Non-goal: every GPU model; the profiles are the calibrated ones of ``docs/sim.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from topo_tune.errors import SimInputError
from topo_tune.v1 import topology_pb2


@dataclass(frozen=True)
class NodeProfile:
    gpu_name: str
    sm_arch: str
    memory_bytes: int
    nvlinks: int  # per GPU, all to NVSwitches; 0: PCIe only
    nics: int
    nic_gbps: float
    virtualized: bool = False


PROFILES = MappingProxyType(
    {
        "h100-nvswitch": NodeProfile("NVIDIA H100 80GB HBM3", "sm_90", 80 << 30, 18, 8, 400.0),
        "h200-nvswitch": NodeProfile("NVIDIA H200", "sm_90", 141 << 30, 18, 8, 400.0),
        "pcie": NodeProfile("NVIDIA L40S", "sm_89", 48 << 30, 0, 2, 100.0),
    }
)


def simulated_node_topology(
    hostname: str, *, profile: str = "h100-nvswitch", gpus: int = 8
) -> topology_pb2.NodeTopology:
    """The topology a ``sim`` agent registers for ``hostname``."""
    spec = PROFILES.get(profile)
    if spec is None:
        raise SimInputError("profile", f"unknown simulated node profile {profile!r}; known: {', '.join(PROFILES)}")
    if not 1 <= gpus <= 64:
        raise SimInputError("gpus", f"must be 1..64, got {gpus}")
    topo = topology_pb2.NodeTopology(hostname=hostname, cpu_count=128, memory_bytes=2 << 40, cpu_model="simulated")
    topo.virtualized = spec.virtualized
    topo.versions.nccl = "simulated"
    topo.source = "simulated"
    for index in range(gpus):
        gpu = topo.gpus.add(
            index=index,
            uuid=f"GPU-sim-{hostname}-{index}",
            name=spec.gpu_name,
            pci_bus_id=f"0000:{0x18 + index * 0x10:02x}:00.0",
        )
        gpu.sm_arch = spec.sm_arch
        gpu.memory_bytes = spec.memory_bytes
        gpu.numa_node = 0 if index < gpus // 2 or gpus == 1 else 1
    for a in range(gpus):
        for b in range(a + 1, gpus):
            link = topo.gpu_links.add(
                gpu_a=a, gpu_b=b, p2p_read=topology_pb2.P2P_STATUS_OK, p2p_write=topology_pb2.P2P_STATUS_OK
            )
            if spec.nvlinks:
                link.kind = topology_pb2.LINK_KIND_NVLINK
                link.nvlink_count = spec.nvlinks
                link.via_nvswitch = True
            else:
                link.kind = (
                    topology_pb2.LINK_KIND_NODE
                    if gpu_numa(topo, a) == gpu_numa(topo, b)
                    else (topology_pb2.LINK_KIND_SYS)
                )
    for index in range(spec.nics):
        nic = topo.nics.add(
            name=f"mlx5_{index}",
            link_layer=topology_pb2.NIC_LINK_LAYER_INFINIBAND,
            port_state="ACTIVE",
            pci_bus_id=f"0000:{0x1A + index * 0x10:02x}:00.0",
        )
        nic.rate_gbps = spec.nic_gbps
        nic.gdr = True
    topo.unknowns.append("simulated node: no hardware was discovered")
    return topo


def gpu_numa(topo: topology_pb2.NodeTopology, index: int) -> int:
    return topo.gpus[index].numa_node
