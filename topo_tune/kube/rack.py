"""A node's rack, read from one of its Kubernetes labels (``rackLabel`` in cluster.yaml).

Used by the agent at start-up and on every rediscovery when no ``--rack`` is given. Reading never raises:
the agent must run even when the API is unreachable or its RBAC is missing; the rack is then empty (the
controller may still know it from cluster.yaml) and the reason is logged.
"""

from __future__ import annotations

import logging

from topo_tune.kube.environment import KubeEnvironment

logger = logging.getLogger(__name__)

DEFAULT_RACK_LABEL = "topology.kubernetes.io/rack"


class NodeRackReader:
    """Callable returning the value of ``label`` on node ``node_name``, or "" when it cannot be read."""

    def __init__(self, *, environment: KubeEnvironment, node_name: str, label: str = DEFAULT_RACK_LABEL) -> None:
        self.environment = environment
        self.node_name = node_name
        self.label = label

    def __call__(self) -> str:
        # Imported here: only agents in Kubernetes mode load the kubernetes client.
        from topo_tune.kube.api import KubeApi  # noqa: PLC0415

        try:
            api = KubeApi.connect(self.environment)
            try:
                node = api.read_node(self.node_name)
            finally:
                api.close()
        # Anything at all (unreachable API, forbidden, a bad CA file): the agent runs on without a rack.
        except Exception as error:
            logger.warning("cannot read the rack label %s: %s", self.label, error, extra={"node": self.node_name})
            return ""
        rack = node.labels.get(self.label, "")
        if not rack:
            logger.warning("the node has no label %s: no rack", self.label, extra={"node": self.node_name})
        return rack
