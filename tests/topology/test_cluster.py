from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from topo_tune.errors import ClusterModelError
from topo_tune.topology.cluster import Spine, build_cluster, racks_from_labels, render_admin_topology
from topo_tune.topology.fingerprint import topology_fingerprint
from topo_tune.topology.matrix import render_node_matrix
from topo_tune.v1 import topology_pb2

Machine = Callable[[str], topology_pb2.NodeTopology]


@pytest.fixture
def nodes(machine: Machine) -> dict[str, topology_pb2.NodeTopology]:
    out = {}
    for name, fixture in (
        ("hgx-01", "hgx-h100-8nic"),
        ("hgx-02", "hgx-h100-8nic"),
        ("pcie-01", "pcie-2socket-8gpu"),
        ("h200-vm", "h200-vm"),
    ):
        topo = machine(fixture)
        topo.hostname = name
        out[name] = topo
    return out


def test_admin_topology_shows_the_cluster_as_racks(nodes: dict[str, topology_pb2.NodeTopology]) -> None:
    cluster = build_cluster(
        nodes,
        {"hgx-01": "rack-a", "hgx-02": "rack-a", "pcie-01": "rack-b"},
        spine=Spine(oversubscription=2.0, bandwidth_gbps=200),
    )
    text = render_admin_topology(cluster)
    lines = text.splitlines()
    assert lines[0].startswith(f"Cluster {cluster.fingerprint}: 4 nodes in 3 racks")
    assert "Spine: oversubscription 2:1, at most 200 Gb/s per node across it" in text
    rack_a = lines.index("Rack rack-a (2 nodes)")
    assert lines[rack_a + 1].lstrip().startswith("hgx-01")
    assert "8x NVIDIA H100 80GB HBM3 [NV18:28]" in lines[rack_a + 1]
    assert "8x 400G INFINIBAND" in lines[rack_a + 1]
    assert "Rack default (1 nodes)" in text, "a node without a rack lands in the default rack"
    h200_line = next(line for line in lines if line.lstrip().startswith("h200-vm"))
    assert "1x NVIDIA H200" in h200_line and "unknown" in h200_line
    # Two identical machines share a fingerprint, which the view prints on both lines.
    fp = topology_fingerprint(nodes["hgx-01"])
    assert text.count(fp) == 2


def test_admin_topology_node_view_is_the_matrix(nodes: dict[str, topology_pb2.NodeTopology]) -> None:
    cluster = build_cluster(nodes, {"pcie-01": "rack-b"})
    text = render_admin_topology(cluster, node="pcie-01")
    assert text.startswith(f"Rack rack-b, fingerprint {cluster.fingerprints['pcie-01']}\n")
    assert text.endswith(render_node_matrix(nodes["pcie-01"]))
    assert "GPU0  X     PIX   PHB" in text


def test_admin_topology_json(nodes: dict[str, topology_pb2.NodeTopology]) -> None:
    cluster = build_cluster(nodes, {"hgx-01": "a", "hgx-02": "b", "pcie-01": "b", "h200-vm": "b"})
    data = json.loads(render_admin_topology(cluster, output="json"))
    assert data["racks"] == [
        {"name": "a", "nodes": ["hgx-01"]},
        {"name": "b", "nodes": ["h200-vm", "hgx-02", "pcie-01"]},
    ]
    assert data["nodes"]["hgx-02"]["topology"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert data["fingerprint"] == cluster.fingerprint
    one = json.loads(render_admin_topology(cluster, node="h200-vm", output="json"))
    assert one["rack"] == "b" and "numa_node" not in one["topology"]["gpus"][0]


def test_cluster_model_errors_name_the_node(nodes: dict[str, topology_pb2.NodeTopology]) -> None:
    with pytest.raises(ClusterModelError, match="'ghost'"):
        build_cluster(nodes, {"ghost": "a"})
    with pytest.raises(ClusterModelError, match="'pcie-01' has no rack"):
        build_cluster({"pcie-01": nodes["pcie-01"]}, {}, default_rack=None)
    cluster = build_cluster(nodes, {})
    with pytest.raises(ClusterModelError, match="unknown node 'nope'"):
        render_admin_topology(cluster, node="nope")
    with pytest.raises(ClusterModelError, match="oversubscription"):
        Spine(oversubscription=0.5)
    with pytest.raises(ClusterModelError, match=r"spine\.bandwidth_gbps"):
        Spine(bandwidth_gbps=0)


def test_racks_from_kubernetes_labels() -> None:
    labels = {"n1": {"topology.example.com/rack": "r1"}, "n2": {"other": "x"}}
    assert racks_from_labels(labels, label="topology.example.com/rack") == {"n1": "r1"}


def test_node_pairs_follow_racks_and_spine(nodes: dict[str, topology_pb2.NodeTopology]) -> None:
    cluster = build_cluster(
        {k: nodes[k] for k in ("hgx-01", "hgx-02", "pcie-01")},
        {"hgx-01": "a", "hgx-02": "b", "pcie-01": "b"},
        spine=Spine(oversubscription=4.0),
    )
    pairs = cluster.node_pairs()
    assert pairs.get("hgx-01", "hgx-02").bandwidth_gbps == pytest.approx(8 * 400 / 8 / 4)
