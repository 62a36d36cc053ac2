"""A node and the cluster's nodes as the controller keeps them, in the words both the controller and a tuning pass use.

The controller's registry answers in these; a tuning pass reads them through its port (``AdminPort``), which the
gRPC client fills from the admin API's messages at its edge and a controller-run study fills in-process. A node's
topology stays the shared topology model (``topology_pb2``), which is not the admin API. Non-goals: what only an
operator reads (commands, drain, applied config versions), the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from topo_tune.ids import NodeName
from topo_tune.v1 import topology_pb2

__all__ = ["NodeInfo", "NodeInventory", "NodeState"]


class NodeState(StrEnum):
    READY = "ready"
    LOST = "lost"


@dataclass(frozen=True)
class NodeInfo:
    name: NodeName
    rack: str
    state: NodeState
    backend: str
    """nccl, gloo or sim; empty where the agent reported none the controller knows."""
    registrations: int = 0
    last_heartbeat_at: datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    topology: topology_pb2.NodeTopology | None = None
    """What the agent discovered; ``None`` in the node list (only the topology view carries it)."""


@dataclass(frozen=True)
class NodeInventory:
    """Every node with its topology, and the spine from cluster.yaml where it names one."""

    nodes: tuple[NodeInfo, ...]
    spine_oversubscription: float | None = None
    spine_bandwidth_gbps: float | None = None
