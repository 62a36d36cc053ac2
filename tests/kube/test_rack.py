"""The agent's rack from its Node's label; never an exception, whatever the API does."""

from __future__ import annotations

import logging

import pytest

from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import FakeApiServer
from topo_tune.kube.rack import NodeRackReader


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
    assert "the node has no label topology.kubernetes.io/rack: no rack" in messages[0]
    assert 'nodes "gpu-2" not found' in messages[1]
    assert "401" in messages[2]
    assert "cannot read the rack label" in messages[3]
