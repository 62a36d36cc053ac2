from __future__ import annotations

from collections.abc import Callable
from xml.etree import ElementTree

import pytest

from topo_tune.errors import ExpertModeRequired
from topo_tune.tuner.ring.gpu_order import intra_node_ring, render_graph_file
from topo_tune.v1 import topology_pb2

Machine = Callable[[str], topology_pb2.NodeTopology]


def test_pcie_node_ring_keeps_switch_pairs_together_and_crosses_sockets_twice(machine: Machine) -> None:
    topo = machine("pcie-2socket-8gpu")
    ring = intra_node_ring(topo)
    assert not ring.uniform
    order = list(ring.order)
    socket = [0 if g < 4 else 1 for g in order]
    assert sum(socket[i] != socket[(i + 1) % 8] for i in range(8)) == 2
    neighbours = {frozenset((order[i], order[(i + 1) % 8])) for i in range(8)}
    assert sum(frozenset(pair) in neighbours for pair in ((0, 1), (2, 3), (4, 5), (6, 7))) == 4


def test_nvswitch_node_is_uniform(machine: Machine) -> None:
    ring = intra_node_ring(machine("hgx-h100-8nic"))
    assert ring.uniform and ring.bottleneck_gbps == pytest.approx(450.0)


def test_graph_file_only_in_expert_mode(machine: Machine) -> None:
    topo = machine("hgx-h100-8nic")
    ring = intra_node_ring(topo)
    with pytest.raises(ExpertModeRequired, match="expert=True"):
        render_graph_file(topo, ring, expert=False)
    root = ElementTree.fromstring(render_graph_file(topo, ring, expert=True, nchannels=2))
    (graph,) = root.findall("graph")
    assert graph.get("pattern") == "4" and graph.get("typeintra") == "NVL" and graph.get("nchannels") == "2"
    channels = graph.findall("channel")
    assert len(channels) == 2
    first = [g.get("dev") for g in channels[0].findall("gpu")]
    assert first == [f"{g:x}" for g in ring.order]
    nets = [n.get("dev") for n in channels[0].findall("net")]
    assert nets == ["4", "4"], "GPU0's own rail NIC (mlx5_4, PIX) enters and leaves the channel"
