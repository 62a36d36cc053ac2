"""RDMA devices with several ports: one endpoint per ACTIVE port, as NCCL opens them, in discovery and in XML."""

from __future__ import annotations

from collections.abc import Callable

from topo_tune.sim.topology_import import nics_of
from topo_tune.topology.matrix import node_matrix, render_node_matrix
from topo_tune.topology.nccl_dump import read_nccl_topology
from topo_tune.topology.nccl_topo_file import nccl_topology_xml
from topo_tune.topology.nccl_xml import parse_xml
from topo_tune.topology.nic_ports import Endpoint, folded_bus_id, nccl_ports
from topo_tune.v1 import topology_pb2

Machine = Callable[[str], topology_pb2.NodeTopology]
IB, ROCE = topology_pb2.NIC_LINK_LAYER_INFINIBAND, topology_pb2.NIC_LINK_LAYER_ROCE


def _endpoints(topo: topology_pb2.NodeTopology) -> dict[str, tuple[object, ...]]:
    return {
        n.name: (n.device, n.port if n.HasField("port") else None, n.rate_gbps, n.link_layer, n.gdr) for n in topo.nics
    }


def test_each_active_port_is_its_own_nic_and_a_down_port_is_left_out_with_its_reason(machine: Machine) -> None:
    topo = machine("dual-port-hca")
    assert _endpoints(topo) == {
        # ConnectX-3 Pro: port 1 up; port 2 disabled, so mlx4_0 has one endpoint and keeps its plain name.
        "mlx4_0": ("mlx4_0", 1, 56.0, IB, True),
        # mlx5 multiport RoCE: both ports up, so each is named as NCCL_IB_HCA names one port.
        "mlx5_0:1": ("mlx5_0", 1, 100.0, ROCE, True),
        "mlx5_0:2": ("mlx5_0", 2, 100.0, ROCE, True),
    }
    netdevs = {n.name: list(n.netdevs) for n in topo.nics}
    assert netdevs == {"mlx4_0": ["ib0"], "mlx5_0:1": ["ens1f0np0"], "mlx5_0:2": []}
    [(name, reason)] = [(x.name, x.reason) for x in topo.excluded_nics]
    assert name == "mlx4_0:2" and "DOWN" in reason and "Disabled" in reason
    assert not any("mlx4_0:2" in u for u in topo.unknowns), "a port known to be down is not an unknown"
    rendered = render_node_matrix(topo)
    assert "NIC2: mlx5_0:2" in rendered and "mlx4_0:2: port 2 is DOWN" in rendered
    m = node_matrix(topo)
    assert (m.cell("GPU0", "NIC1"), m.cell("GPU0", "NIC2"), m.cell("GPU0", "NIC0")) == ("PIX", "PIX", "PHB")
    # The sim models each active port as its own rail.
    assert [(n.name, n.rail) for n in nics_of(topo)] == [("mlx4_0", 0), ("mlx5_0:1", 1), ("mlx5_0:2", 2)]


def test_the_xml_writer_lists_the_ports_as_nccl_does_and_reads_back_the_same_endpoints(machine: Machine) -> None:
    topo = machine("dual-port-hca")
    text = nccl_topology_xml(topo)
    root = parse_xml(text)
    nics = [(pci, child) for pci in _walk(root) for child in pci.children if child.tag == "nic"]
    by_bus = {
        next(a.value for a in pci.attributes if a.name == "busid"): [
            {a.name: a.value for a in net.attributes} for net in nic.children
        ]
        for pci, nic in nics
    }
    # One <nic> per PCI device; NCCL numbers a device's second endpoint's port as 2 + 1 earlier endpoint there.
    assert by_bus == {
        "0000:1b:00.0": [
            {"name": "mlx5_0", "dev": "0", "speed": "100000", "port": "1", "gdr": "1"},
            {"name": "mlx5_0", "dev": "1", "speed": "100000", "port": "3", "gdr": "1"},
        ],
        "0000:1d:00.0": [{"name": "mlx4_0", "dev": "2", "speed": "56000", "port": "1", "gdr": "1"}],
    }
    back = read_nccl_topology(text, source="written.xml")
    assert _endpoints(back) == _endpoints(topo)
    kinds = {(a.nic, a.gpu): a.kind for a in topo.nic_affinities}
    assert {(a.nic, a.gpu): a.kind for a in back.nic_affinities} == kinds


def test_a_dual_function_card_is_folded_onto_function_zero_and_its_ports_numbered_in_turn() -> None:
    # ConnectX-7 dual port: mlx5_0 and mlx5_1 are two PCI functions, each with its own port 1.
    numbering = nccl_ports(
        [
            Endpoint(name="mlx5_1", bus_id="0000:3b:00.1", port=1),
            Endpoint(name="mlx5_2", bus_id="0000:86:00.0", port=1),
            Endpoint(name="mlx5_0", bus_id="0000:3b:00.0", port=1),
        ]
    )
    assert {k: (v.dev, v.port) for k, v in numbering.items()} == {"mlx5_0": (0, 1), "mlx5_1": (1, 2), "mlx5_2": (2, 1)}
    assert folded_bus_id("0000:3b:00.1") == folded_bus_id("0000:3b:02.3") == "0000:3b:00.0"
    # The shape NCCL dumps for such a card: both functions under function 0, port="2" for the second.
    text = """<system version="1">
  <cpu numaid="0">
    <pci busid="0000:3b:00.0" class="0x020700">
      <nic>
        <net name="mlx5_0" dev="0" speed="400000" port="1" guid="0x66a9020003f340cc" maxconn="131072" gdr="1"/>
        <net name="mlx5_1" dev="1" speed="400000" port="2" guid="0x66a9020003f340cc" maxconn="131072" gdr="1"/>
      </nic>
    </pci>
  </cpu>
</system>
"""
    topo = read_nccl_topology(text, source="cx7.xml")
    assert [(n.name, n.device, n.port) for n in topo.nics] == [("mlx5_0", "mlx5_0", 1), ("mlx5_1", "mlx5_1", 1)]


def _walk(node):  # type: ignore[no-untyped-def]
    yield node
    for child in node.children:
        yield from _walk(child)
