"""The kubernetes client over a real socket: what topo-tune reads and writes, and how failures surface."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import FakeApiServer
from topo_tune.errors import KubernetesError
from topo_tune.kube.api import KubeApi
from topo_tune.kube.environment import KubeEnvironment
from topo_tune.kube.objects import Lease


def test_reads_a_node_and_lists_only_its_pods(apiserver: FakeApiServer, kube_env: KubeEnvFactory) -> None:
    apiserver.add_node("gpu-1", labels={"topology.kubernetes.io/rack": "r7"}, unschedulable=True)
    apiserver.add_pod("team-a", "train-0", node="gpu-1", limits={"nvidia.com/gpu": "8"})
    apiserver.add_pod("team-b", "train-1", node="gpu-2", requests={"nvidia.com/gpu": "8"})
    api = KubeApi.connect(kube_env("agent"))

    node = api.read_node("gpu-1")
    pods = api.pods_on_node("gpu-1")

    assert node.labels["topology.kubernetes.io/rack"] == "r7"
    assert node.unschedulable
    assert [(p.namespace, p.name, p.phase, dict(p.resources)) for p in pods] == [
        ("team-a", "train-0", "Running", {"nvidia.com/gpu": "8"})
    ]
    assert ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1", "agent") in apiserver.requests


def test_failures_carry_the_status_and_the_servers_reason(apiserver: FakeApiServer, kube_env: KubeEnvFactory) -> None:
    api = KubeApi.connect(kube_env("agent"))
    with pytest.raises(KubernetesError, match='nodes "missing" not found') as missing:
        api.read_node("missing")
    assert missing.value.status == 404

    apiserver.tokens.discard("agent")
    with pytest.raises(KubernetesError) as refused:
        api.read_node("missing")
    assert refused.value.status == 401


def test_an_unreachable_api_is_a_kubernetes_error_without_status(apiserver: FakeApiServer) -> None:
    url = apiserver.url
    apiserver.stop()
    api = KubeApi.connect(KubeEnvironment(api_url=url, request_timeout_s=1))
    with pytest.raises(KubernetesError, match="reading node gpu-1") as caught:
        api.read_node("gpu-1")
    assert caught.value.status is None


def test_a_rotated_token_is_used_on_the_next_request(apiserver: FakeApiServer, kube_env: KubeEnvFactory) -> None:
    environment = kube_env("old-token")
    apiserver.add_node("gpu-1")
    api = KubeApi.connect(environment)
    api.read_node("gpu-1")
    assert environment.token_file is not None
    environment.token_file.write_text("new-token", encoding="utf-8")  # kubelet rotates projected tokens
    apiserver.tokens = {"new-token"}
    api.read_node("gpu-1")
    assert [token for _m, _p, token in apiserver.requests] == ["old-token", "new-token"]


def test_lease_writes_are_conditional_on_the_resource_version(kube_env: KubeEnvFactory) -> None:
    api = KubeApi.connect(kube_env("controller"))
    # Microsecond 0 is where isoformat() drops the fraction that the API server requires.
    at = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
    created = api.create_lease("topo-tune", "leader", Lease("a", 15, at, at, transitions=0))
    assert api.read_lease("topo-tune", "leader") == created
    with pytest.raises(KubernetesError) as twice:
        api.create_lease("topo-tune", "leader", Lease("b", 15, at, at, transitions=0))
    assert twice.value.status == 409

    renewed = api.replace_lease("topo-tune", "leader", Lease("a", 15, at, at, 0, created.resource_version))
    assert renewed.resource_version != created.resource_version
    with pytest.raises(KubernetesError, match="the object has been modified") as stale:
        api.replace_lease("topo-tune", "leader", Lease("b", 15, at, at, 1, created.resource_version))
    assert stale.value.status == 409
    assert api.read_lease("topo-tune", "leader") == renewed
    assert api.read_lease("topo-tune", "nobody") is None
