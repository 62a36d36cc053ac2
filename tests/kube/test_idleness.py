"""Which GPU nodes may run a benchmark: cordoned ones, or those without GPU pods (topo-tune's own aside)."""

from __future__ import annotations

import pytest

from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import FakeApiServer
from topo_tune.kube.api import KubeApi
from topo_tune.kube.idleness import AssumeIdle, IdlenessPolicy, KubernetesNodeIdleness, busy_nodes


@pytest.fixture
def idleness(apiserver: FakeApiServer, kube_env: KubeEnvFactory) -> KubernetesNodeIdleness:
    apiserver.add_node("gpu-1")
    return KubernetesNodeIdleness(KubeApi.connect(kube_env("controller")))


async def test_a_node_without_gpu_pods_is_idle(apiserver: FakeApiServer, idleness: KubernetesNodeIdleness) -> None:
    apiserver.add_pod("kube-system", "dcgm-exporter", node="gpu-1")  # no GPU request
    apiserver.add_pod("team-a", "done", node="gpu-1", phase="Succeeded", limits={"nvidia.com/gpu": "8"})
    apiserver.add_pod("team-a", "zero", node="gpu-1", requests={"nvidia.com/gpu": "0"})
    apiserver.add_pod("team-b", "elsewhere", node="gpu-2", limits={"nvidia.com/gpu": "8"})
    verdict = await idleness.check("gpu-1")
    assert verdict.idle, verdict.reason
    assert verdict.reason == "no pod requests GPUs"


@pytest.mark.parametrize(
    "pod",
    [
        {"limits": {"nvidia.com/gpu": "1"}},  # extended resources are often given as limits only
        {"requests": {"nvidia.com/gpu": "8"}, "phase": "Pending"},  # bound, about to start on the GPUs
        {"init_limits": {"nvidia.com/gpu": "1"}},
        {"limits": {"nvidia.com/mig-1g.18gb": "2"}},
        {"limits": {"nvidia.com/gpu.shared": "1"}},
    ],
)
async def test_a_pod_that_uses_gpus_makes_the_node_busy(
    apiserver: FakeApiServer, idleness: KubernetesNodeIdleness, pod: dict[str, object]
) -> None:
    apiserver.add_pod("team-a", "train-0", node="gpu-1", **pod)  # type: ignore[arg-type]
    verdict = await idleness.check("gpu-1")
    assert not verdict.idle
    assert verdict.reason == "GPU pods on the node: team-a/train-0"


async def test_a_cordoned_node_is_idle_whatever_runs_there(
    apiserver: FakeApiServer, idleness: KubernetesNodeIdleness
) -> None:
    apiserver.add_node("gpu-1", unschedulable=True)
    apiserver.add_pod("team-a", "train-0", node="gpu-1", limits={"nvidia.com/gpu": "8"})
    verdict = await idleness.check("gpu-1")
    assert verdict.idle
    assert verdict.reason == "cordoned"


async def test_topo_tunes_own_pods_do_not_count(apiserver: FakeApiServer, kube_env: KubeEnvFactory) -> None:
    apiserver.add_node("gpu-1")
    apiserver.add_pod(
        "topo-tune", "bench-0", node="gpu-1", labels={"app.kubernetes.io/name": "tt"}, limits={"nvidia.com/gpu": "8"}
    )
    policy = IdlenessPolicy(own_pod_labels={"app.kubernetes.io/name": "tt"})
    assert (await KubernetesNodeIdleness(KubeApi.connect(kube_env("c")), policy).check("gpu-1")).idle
    assert not (await KubernetesNodeIdleness(KubeApi.connect(kube_env("c"))).check("gpu-1")).idle


async def test_many_busy_pods_are_summarised(apiserver: FakeApiServer, idleness: KubernetesNodeIdleness) -> None:
    for i in range(7):
        apiserver.add_pod("team-a", f"train-{i}", node="gpu-1", limits={"nvidia.com/gpu": "1"})
    verdict = await idleness.check("gpu-1")
    assert verdict.reason.endswith("team-a/train-4 and 2 more")


async def test_a_node_that_cannot_be_read_is_not_idle(apiserver: FakeApiServer, kube_env: KubeEnvFactory) -> None:
    idleness = KubernetesNodeIdleness(KubeApi.connect(kube_env("controller")))
    missing = await idleness.check("gpu-9")
    assert not missing.idle
    assert 'nodes "gpu-9" not found' in missing.reason
    apiserver.add_node("gpu-1")
    apiserver.unreachable.add("controller")
    assert not (await idleness.check("gpu-1")).idle, "an API outage must never look idle"


async def test_outside_kubernetes_every_node_counts_as_idle() -> None:
    verdict = await AssumeIdle().check("n1")
    assert verdict.idle
    assert "not checked" in verdict.reason


async def test_a_jobs_busy_nodes_are_named_with_their_reasons(
    apiserver: FakeApiServer, idleness: KubernetesNodeIdleness
) -> None:
    apiserver.add_node("gpu-2", unschedulable=True)
    apiserver.add_node("gpu-3")
    apiserver.add_pod("team-a", "train-0", node="gpu-3", limits={"nvidia.com/gpu": "8"})
    busy = await busy_nodes(idleness, ["gpu-1", "gpu-2", "gpu-3", "gpu-4"])
    assert [(v.node_name, v.reason) for v in busy] == [
        ("gpu-3", "GPU pods on the node: team-a/train-0"),
        ("gpu-4", 'unknown, so not idle: reading node gpu-4: 404 Not Found: nodes "gpu-4" not found'),
    ]
