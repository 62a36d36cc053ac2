"""Is a node idle enough for a benchmark? The check the controller makes before it sends benchmark work.

The agent gets the GPUs from the container runtime without requesting ``nvidia.com/gpu`` (as monitoring
agents do), so the scheduler may place a training pod on the same GPUs at any time. A benchmark therefore
runs only on a node that is cordoned (``spec.unschedulable``: nothing new is scheduled there) or on which no
pod that has not finished requests a GPU resource, topo-tune's own pods excepted. Pending pods count: a
pod bound to the node is about to start on its GPUs.

When the API cannot be read the answer is "not idle": a benchmark must never run on a node whose state is
unknown. Outside Kubernetes there is nothing to ask (``AssumeIdle``); there the operator drains nodes.

Non-goals: cordoning nodes, watching pods (the check is made per benchmark, just before sending it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from topo_tune.errors import KubernetesError
from topo_tune.kube.objects import KubeNode, PodInfo

if TYPE_CHECKING:
    from topo_tune.kube.api import KubeApi

logger = logging.getLogger(__name__)

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class IdleVerdict:
    node_name: str
    idle: bool
    reason: str
    """Why, in words an operator can act on (e.g. the busy pods' names)."""


@dataclass(frozen=True)
class IdlenessPolicy:
    gpu_resource_prefixes: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-")
    """Resource names that mean "uses GPUs": whole GPUs, shared GPUs and MIG slices."""
    own_pod_labels: Mapping[str, str] = field(default_factory=lambda: {"app.kubernetes.io/name": "topo-tune"})
    """Pods with all of these labels are topo-tune's own and never make a node busy."""


class NodeIdleness(Protocol):
    """What the benchmark scheduler asks before it sends benchmark work to a node."""

    async def check(self, node_name: str) -> IdleVerdict: ...


def _uses_gpus(pod: PodInfo, policy: IdlenessPolicy) -> bool:
    return any(
        quantity != "0" and resource.startswith(policy.gpu_resource_prefixes)
        for resource, quantity in pod.resources.items()
    )


def _is_own(pod: PodInfo, policy: IdlenessPolicy) -> bool:
    return bool(policy.own_pod_labels) and all(
        pod.labels.get(key) == value for key, value in policy.own_pod_labels.items()
    )


def judge(node: KubeNode, pods: Sequence[PodInfo], policy: IdlenessPolicy) -> IdleVerdict:
    """The verdict for ``node`` given the pods bound to it."""
    if node.unschedulable:
        return IdleVerdict(node.name, idle=True, reason="cordoned")
    busy = sorted(
        f"{pod.namespace}/{pod.name}"
        for pod in pods
        if pod.phase not in FINISHED_PHASES and _uses_gpus(pod, policy) and not _is_own(pod, policy)
    )
    if busy:
        shown = ", ".join(busy[:5]) + (f" and {len(busy) - 5} more" if len(busy) > 5 else "")
        return IdleVerdict(node.name, idle=False, reason=f"GPU pods on the node: {shown}")
    return IdleVerdict(node.name, idle=True, reason="no pod requests GPUs")


async def busy_nodes(idleness: NodeIdleness, node_names: Sequence[str]) -> list[IdleVerdict]:
    """The verdicts of the nodes among ``node_names`` that are not idle (checked concurrently, in order)."""
    verdicts = await asyncio.gather(*(idleness.check(name) for name in node_names))
    return [verdict for verdict in verdicts if not verdict.idle]


class KubernetesNodeIdleness:
    """``NodeIdleness`` from the API: the node's ``spec.unschedulable`` and the pods bound to it."""

    def __init__(self, api: KubeApi, policy: IdlenessPolicy | None = None) -> None:
        self._api = api
        self._policy = policy or IdlenessPolicy()

    def check_now(self, node_name: str) -> IdleVerdict:
        """Blocking variant of ``check``."""
        try:
            node = self._api.read_node(node_name)
            pods = [] if node.unschedulable else self._api.pods_on_node(node_name)
        except KubernetesError as error:
            logger.warning("cannot tell whether the node is idle: %s", error, extra={"node": node_name})
            return IdleVerdict(node_name, idle=False, reason=f"unknown, so not idle: {error}")
        return judge(node, pods, self._policy)

    async def check(self, node_name: str) -> IdleVerdict:
        return await asyncio.to_thread(self.check_now, node_name)


class AssumeIdle:
    """``NodeIdleness`` outside Kubernetes: no scheduler shares the GPUs, so every node counts as idle."""

    async def check(self, node_name: str) -> IdleVerdict:
        return IdleVerdict(node_name, idle=True, reason="not running in Kubernetes: not checked")
