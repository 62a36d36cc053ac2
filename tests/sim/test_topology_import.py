"""Building a simulated cluster from the agents' NodeTopology messages."""

from __future__ import annotations

import pytest

from topo_tune.sim import FabricKind, SimInputError, SpineTier, Transport, simulate
from topo_tune.sim.profiles import H100_SXM, PCIE_GPU
from topo_tune.sim.topology_import import cluster_from_topologies
from topo_tune.v1 import topology_pb2 as tp


def _dgx_h100(hostname: str) -> tp.NodeTopology:
    """An 8x H100 SXM node as discovery reports it: NV18 to every peer through NVSwitch, 8 NDR HCAs."""
    topo = tp.NodeTopology(hostname=hostname, cpu_count=224, virtualized=False)
    for i in range(8):
        topo.gpus.add(index=i, name="NVIDIA H100 80GB HBM3", pci_bus_id=f"0000:{0x18 + i:02x}:00.0", sm_arch="sm_90")
    for a in range(8):
        for b in range(a + 1, 8):
            topo.gpu_links.add(gpu_a=a, gpu_b=b, kind=tp.LINK_KIND_NVLINK, nvlink_count=18, via_nvswitch=True)
    for i in range(8):
        topo.nics.add(name=f"mlx5_{i}", link_layer=tp.NIC_LINK_LAYER_INFINIBAND, port_state="ACTIVE", rate_gbps=400.0)
    topo.nics.add(name="eno1", link_layer=tp.NIC_LINK_LAYER_ETHERNET, port_state="up", rate_gbps=25.0)
    topo.nics.add(name="mlx5_9", link_layer=tp.NIC_LINK_LAYER_INFINIBAND, port_state="DOWN", rate_gbps=400.0)
    return topo


def _pcie_box(hostname: str) -> tp.NodeTopology:
    """Four PCIe GPUs, no NVLink, one 100G Ethernet NIC without RDMA."""
    topo = tp.NodeTopology(hostname=hostname)
    for i in range(4):
        topo.gpus.add(index=i, name="NVIDIA L40S", pcie_gen_current=4, pcie_width_current=16)
    for a in range(4):
        for b in range(a + 1, 4):
            topo.gpu_links.add(gpu_a=a, gpu_b=b, kind=tp.LINK_KIND_PHB)
    topo.nics.add(name="eth0", link_layer=tp.NIC_LINK_LAYER_ETHERNET, port_state="up", rate_gbps=100.0)
    return topo


def test_an_nvswitch_node_becomes_an_nvswitch_fabric_with_its_active_hcas() -> None:
    cluster = cluster_from_topologies(
        [_dgx_h100("a1"), _dgx_h100("b1")],
        racks={"a1": "rack-a", "b1": "rack-b"},
        spine=SpineTier(oversubscription=2),
    )
    node = cluster.node("a1")
    assert node.gpus == 8
    assert node.fabric.kind is FabricKind.NVSWITCH
    assert node.fabric.bandwidth_gbs == pytest.approx(450.0)
    assert node.fabric.nvls is True
    assert [nic.name for nic in node.nics] == [f"mlx5_{i}" for i in range(8)]
    assert {nic.transport for nic in node.nics} == {Transport.IB}
    assert [nic.rail for nic in node.nics] == list(range(8))
    assert node.profile == H100_SXM
    assert cluster.racks == ("rack-a", "rack-b")
    result = simulate(cluster, collective="all_reduce", sizes=[1 << 30], env={}, rank_order=["a1", "b1"], seed=0)
    assert result.nranks == 16
    assert result.sizes[0].busbw_gbs > 100


def test_a_pcie_node_with_plain_ethernet_uses_the_socket_transport() -> None:
    cluster = cluster_from_topologies([_pcie_box("p1"), _pcie_box("p2")], racks={"p1": "r", "p2": "r"})
    node = cluster.node("p1")
    assert node.fabric.kind is FabricKind.PCIE
    assert node.fabric.bandwidth_gbs == pytest.approx(1.969 * 16)  # PCIe gen4 x16
    assert node.transport is Transport.SOCKET
    assert node.profile == PCIE_GPU
    slow = simulate(cluster, collective="all_reduce", sizes=[1 << 28], env={}, rank_order=["p1", "p2"], seed=0)
    tuned = simulate(
        cluster,
        collective="all_reduce",
        sizes=[1 << 28],
        env={"NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "2"},
        rank_order=["p1", "p2"],
        seed=0,
    )
    assert tuned.sizes[0].model_time_us < slow.sizes[0].model_time_us


def test_a_virtualized_h200_gets_no_nvls() -> None:
    topo = _dgx_h100("vm")
    topo.virtualized = True
    for gpu in topo.gpus:
        gpu.name = "NVIDIA H200"
    cluster = cluster_from_topologies([topo], racks={"vm": "r"})
    assert cluster.node("vm").fabric.nvls is False


def test_a_node_without_a_rack_or_without_gpus_is_refused_by_name() -> None:
    with pytest.raises(SimInputError, match="racks: no rack for node 'a1'"):
        cluster_from_topologies([_dgx_h100("a1")], racks={})
    empty = tp.NodeTopology(hostname="cpu-only")
    with pytest.raises(SimInputError, match=r"topologies\[0\]\.gpus"):
        cluster_from_topologies([empty], racks={"cpu-only": "r"})
