"""The agent's rack from its Node's label; never an exception, whatever the API does."""

from __future__ import annotations

import logging

import pytest

from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import FakeApiServer
from topo_tune.kube.rack import NodeRackReader, placement


def test_the_rack_is_the_labels_value(apiserver: FakeApiServer, kube_env: KubeEnvFactory) -> None:
    apiserver.add_node("gpu-1", labels={"topology.kubernetes.io/rack": "r7", "example.com/row": "B"})
    assert NodeRackReader(environment=kube_env("agent"), node_name="gpu-1")() == "r7"
    assert NodeRackReader(environment=kube_env("agent"), node_name="gpu-1", label="example.com/row")() == "B"


def test_a_missing_label_or_node_or_api_gives_no_rack_and_says_why(
    apiserver: FakeApiServer, kube_env: KubeEnvFactory, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.add_node("gpu-1")
    environment = kube_env("agent")
    with caplog.at_level(logging.WARNING):
        assert NodeRackReader(environment=environment, node_name="gpu-1")() == ""
        assert NodeRackReader(environment=environment, node_name="gpu-2")() == ""
        apiserver.tokens.clear()  # RBAC or token trouble
        assert NodeRackReader(environment=environment, node_name="gpu-1")() == ""
        apiserver.stop()
        assert NodeRackReader(environment=environment, node_name="gpu-1")() == ""
    messages = [record.getMessage() for record in caplog.records]
    assert "the node has no label topology.kubernetes.io/rack nor a network tier label: no rack" in messages[0]
    assert 'nodes "gpu-2" not found' in messages[1]
    assert "401" in messages[2]
    assert "cannot read the rack label" in messages[3]


TOPOGRAPH = {
    "network.topology.nvidia.com/accelerator": "nvl1",
    "network.topology.nvidia.com/block": "s1",
    "network.topology.nvidia.com/spine": "s2",
    "network.topology.nvidia.com/datacenter": "s3",
}


@pytest.mark.parametrize(
    ("labels", "rack", "hierarchy"),
    [
        (TOPOGRAPH, "nvl1", {k: TOPOGRAPH[k] for k in list(TOPOGRAPH)[1:]}),
        (
            {"network.topology.kubernetes.io/block": "b4", "network.topology.kubernetes.io/spine": "sp1"},
            "b4",
            {"network.topology.kubernetes.io/spine": "sp1"},
        ),
        (
            {"fabric.topograph.run/tier-0": "leaf3", "fabric.topograph.run/tier-1": "sp0"},
            "leaf3",
            {"fabric.topograph.run/tier-1": "sp0"},
        ),
        (
            {f"topology.k8s.aws/network-node-layer-{n}": f"nn-{n}" for n in (1, 2, 3)},
            "nn-3",
            {"topology.k8s.aws/network-node-layer-2": "nn-2", "topology.k8s.aws/network-node-layer-1": "nn-1"},
        ),
        (
            {
                "cloud.google.com/gce-topology-block": "blk",
                "cloud.google.com/gce-topology-subblock": "sub",
                "cloud.google.com/gce-topology-host": "h17",
            },
            "sub",
            {"cloud.google.com/gce-topology-block": "blk"},
        ),
        ({"topology.kubernetes.io/rack": "r7", **TOPOGRAPH}, "r7", {k: TOPOGRAPH[k] for k in list(TOPOGRAPH)[1:]}),
        ({"kubernetes.io/hostname": "gpu-1"}, "", {}),
    ],
    ids=["topograph", "topograph-older", "topograph-1.x", "eks", "gke", "rack-label-first", "none"],
)
def test_the_rack_is_the_lowest_tier_a_provider_labels_and_the_tiers_above_are_kept(
    labels: dict[str, str], rack: str, hierarchy: dict[str, str]
) -> None:
    found = placement(labels)
    assert (found.rack, dict(found.hierarchy)) == (rack, hierarchy)


def test_a_rack_label_of_ones_own_overrides_the_tiers_and_keeps_the_hierarchy() -> None:
    found = placement({"example.com/rack": "row-b", **TOPOGRAPH}, "example.com/rack")
    assert found.rack == "row-b" and found.source == "example.com/rack"
    assert "network.topology.nvidia.com/spine" in found.hierarchy
    assert placement(TOPOGRAPH, "example.com/rack").rack == "", "an explicit label that is missing: no rack"


def test_the_reader_reports_the_tiers_it_read(apiserver: FakeApiServer, kube_env: KubeEnvFactory) -> None:
    apiserver.add_node("gpu-1", labels=TOPOGRAPH)
    reader = NodeRackReader(environment=kube_env("agent"), node_name="gpu-1")
    assert reader() == "nvl1"
    assert reader.hierarchy["network.topology.nvidia.com/spine"] == "s2"
