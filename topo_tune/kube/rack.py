"""A node's rack and the network tiers above it, read from its Kubernetes labels.

Used by the agent at start-up and on every rediscovery when no ``--rack`` is given. Few providers set
``topology.kubernetes.io/rack``; the network hierarchy is published under other names, lowest tier (closest
to the node) first in each scheme below (``TIER_SCHEMES``):

* NVIDIA Topograph: ``network.topology.nvidia.com/accelerator`` (the NVLink domain), then ``leaf`` or
  ``block``, ``spine``, ``core`` or ``datacenter`` (older releases: the same names under
  ``network.topology.kubernetes.io/``); Topograph 1.x: ``fabric.topograph.run/tier-0`` … ``tier-3``;
* EKS: ``topology.k8s.aws/network-node-layer-4`` (four-layer instance types only), ``-3``, ``-2``, ``-1``
  (layer 1 is the top of the hierarchy);
* GKE: ``cloud.google.com/gce-topology-host``, ``-subblock``, ``-block``. The host is one machine, not a
  group of nodes, so it is never the rack; it stays in the hierarchy.

With the default ``rackLabel`` the rack is ``topology.kubernetes.io/rack`` when the node has it, else the
lowest tier present of the first scheme the node carries; the tiers above it are the **hierarchy** (e.g. the
spine block), sent with the registration as node labels so the controller's rollout waves and ring planner
can group by them (``tiers_above`` reads them back, top tier first). A ``rackLabel`` other than the default
overrides: that label alone is the rack (the hierarchy is still read).

Reading never raises: the agent must run even when the API is unreachable or its RBAC is missing; the rack
is then empty (the controller may still know it from cluster.yaml) and the reason is logged.

Non-goals: writing labels (Topograph and the providers do), grouping nodes (the controller does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from topo_tune.kube.environment import KubeEnvironment

logger = logging.getLogger(__name__)

DEFAULT_RACK_LABEL = "topology.kubernetes.io/rack"


@dataclass(frozen=True)
class TierScheme:
    """One provider's tier labels, the tier closest to the node first."""

    provider: str
    tiers: tuple[str, ...]
    not_racks: frozenset[str] = frozenset()  # tiers of one machine each: in the hierarchy, never the rack


def _topograph(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}/{tier}" for tier in ("accelerator", "leaf", "block", "spine", "core", "datacenter"))


TIER_SCHEMES = (
    TierScheme("NVIDIA Topograph", _topograph("network.topology.nvidia.com")),
    TierScheme("NVIDIA Topograph (older releases)", _topograph("network.topology.kubernetes.io")),
    TierScheme("NVIDIA Topograph 1.x", tuple(f"fabric.topograph.run/tier-{n}" for n in range(4))),
    TierScheme("Amazon EKS", tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in (4, 3, 2, 1))),
    TierScheme(
        "Google GKE",
        tuple(f"cloud.google.com/gce-topology-{tier}" for tier in ("host", "subblock", "block")),
        not_racks=frozenset({"cloud.google.com/gce-topology-host"}),
    ),
)


@dataclass(frozen=True)
class Placement:
    """Where the labels put a node: its rack, the label it came from, and the tiers above it (label → value)."""

    rack: str = ""
    source: str = ""  # the label the rack was read from ("" when none)
    hierarchy: Mapping[str, str] = field(default_factory=dict)


def placement(labels: Mapping[str, str], rack_label: str = DEFAULT_RACK_LABEL) -> Placement:
    """The rack and hierarchy ``labels`` give (see the module's rules)."""
    for scheme in TIER_SCHEMES:
        present = [label for label in scheme.tiers if labels.get(label)]
        if not present:
            continue
        lowest = next((label for label in present if label not in scheme.not_racks), None)
        above = present[present.index(lowest) + 1 :] if lowest is not None else present
        hierarchy = {label: labels[label] for label in above}
        if rack_label == DEFAULT_RACK_LABEL and not labels.get(DEFAULT_RACK_LABEL) and lowest is not None:
            return Placement(labels[lowest], lowest, hierarchy)
        break
    else:
        hierarchy = {}
    rack = labels.get(rack_label, "")
    return Placement(rack, rack_label if rack else "", hierarchy)


def tiers_above(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The tier values a registration's labels carry (``Placement.hierarchy``), the top tier first: what the
    controller groups a node's rack by. The first scheme present wins, as in ``placement``; ``()`` for none."""
    for scheme in TIER_SCHEMES:
        present = [labels[label] for label in scheme.tiers if labels.get(label)]
        if present:
            return tuple(reversed(present))
    return ()


class NodeRackReader:
    """Callable returning node ``node_name``'s rack (``placement``), or "" when it cannot be read.

    ``hierarchy`` holds the tiers above the rack from the last read (empty when it failed).
    """

    def __init__(self, *, environment: KubeEnvironment, node_name: str, label: str = DEFAULT_RACK_LABEL) -> None:
        self.environment = environment
        self.node_name = node_name
        self.label = label
        self.hierarchy: Mapping[str, str] = {}

    def __call__(self) -> str:
        # Imported here: only agents in Kubernetes mode load the kubernetes client.
        from topo_tune.kube.api import KubeApi  # noqa: PLC0415

        self.hierarchy = {}
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
        found = placement(node.labels, self.label)
        self.hierarchy = dict(found.hierarchy)
        if not found.rack:
            tried = self.label if self.label != DEFAULT_RACK_LABEL else f"{self.label} nor a network tier label"
            logger.warning("the node has no label %s: no rack", tried, extra={"node": self.node_name})
        elif found.source != self.label:
            logger.info("rack %r from %s", found.rack, found.source, extra={"node": self.node_name})
        return found.rack
