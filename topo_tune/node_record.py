"""A node and the cluster's nodes as the controller keeps them, in the words the controller, a tuning pass and the
CLI use.

The controller's registry answers in these; a tuning pass reads them through its port (``AdminPort``), which the
admin client fills from the admin API's messages at its edge (``wire/nodes.py``) and a controller-run study fills
in-process; ``admin nodes`` and ``admin node`` print them. A node's topology stays the shared topology model
(``topology_pb2``), which is not the admin API. Non-goals: commands (``command_record.py``), the wire.
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
    # What an operator reads (``admin nodes``, ``admin node``); a tuning pass needs none of it.
    registered_at: datetime | None = None
    agent_version: str = ""
    address: str = ""
    """Where peers reach it for benchmarks."""
    drained: bool = False
    activity: str = ""
    """idle, busy or drained, as the agent's last heartbeat said; empty where it said none the controller knows."""
    applied_config_version: str = ""
    config_damage: str = ""
    """The agent's last report of a changed active version; empty while intact."""
    config_apply_error: str = ""
    """Why the node's last finished apply of a config version failed; empty if it did not."""


@dataclass(frozen=True)
class NodeInventory:
    """Every node with its topology, and the spine from cluster.yaml where it names one."""

    nodes: tuple[NodeInfo, ...]
    spine_oversubscription: float | None = None
    spine_bandwidth_gbps: float | None = None
