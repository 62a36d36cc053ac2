"""Nodes on the admin API's wire: a node's state and activity as the messages name them, a ``Node`` message ↔
``NodeInfo``, the cluster topology view → ``NodeInventory``; and a node's plain form (``-o json``).

The controller's servicers send the registry's view of a node through ``node_to_proto``; the admin client reads it
back into the same ``NodeInfo``, which ``admin nodes``, ``admin node`` and a tuning pass use.
Non-goals: the registry (``controller/nodes.py``), gRPC.
"""

from __future__ import annotations

from typing import Any

from topo_tune.ids import NodeName
from topo_tune.node_record import NodeInfo, NodeInventory, NodeState
from topo_tune.v1 import admin_pb2, agent_pb2
from topo_tune.wire.plain_data import to_data
from topo_tune.wire.values import BACKEND_FROM_WIRE, backend_to_wire, instant_or_none, timestamp_or_none

NODE_STATE_TO_WIRE: dict[NodeState, admin_pb2.NodeState.ValueType] = {
    NodeState.READY: admin_pb2.NODE_STATE_READY,
    NodeState.LOST: admin_pb2.NODE_STATE_LOST,
}
ACTIVITY_TO_WIRE: dict[str, agent_pb2.AgentActivity.ValueType] = {
    "idle": agent_pb2.AGENT_ACTIVITY_IDLE,
    "busy": agent_pb2.AGENT_ACTIVITY_BUSY,
    "drained": agent_pb2.AGENT_ACTIVITY_DRAINED,
}
ACTIVITY_FROM_WIRE = {wire: name for name, wire in ACTIVITY_TO_WIRE.items()}


def node_from_proto(node: admin_pb2.Node) -> NodeInfo:
    """A node as the controller sent it; any state but ready counts as lost (the controller sends no other)."""
    return NodeInfo(
        name=NodeName(node.name),
        rack=node.rack,
        state=NodeState.READY if node.state == admin_pb2.NODE_STATE_READY else NodeState.LOST,
        backend=BACKEND_FROM_WIRE.get(node.backend, ""),
        registrations=node.registrations,
        last_heartbeat_at=instant_or_none(node, "last_heartbeat_at"),
        labels=dict(node.labels),
        topology=node.topology if node.HasField("topology") else None,
        registered_at=instant_or_none(node, "registered_at"),
        agent_version=node.agent_version,
        address=node.address,
        drained=node.drained,
        activity=ACTIVITY_FROM_WIRE.get(node.activity, ""),
        applied_config_version=node.applied_config_version,
        config_damage=node.config_damage,
        config_apply_error=node.config_apply_error,
    )


def node_to_proto(node: NodeInfo) -> admin_pb2.Node:
    return admin_pb2.Node(
        name=node.name,
        rack=node.rack,
        state=NODE_STATE_TO_WIRE[node.state],
        labels=dict(node.labels),
        registered_at=timestamp_or_none(node.registered_at),
        last_heartbeat_at=timestamp_or_none(node.last_heartbeat_at),
        agent_version=node.agent_version,
        backend=backend_to_wire(node.backend),
        drained=node.drained,
        activity=ACTIVITY_TO_WIRE.get(node.activity, agent_pb2.AGENT_ACTIVITY_UNSPECIFIED),
        applied_config_version=node.applied_config_version,
        topology=node.topology,
        registrations=node.registrations,
        address=node.address,
        config_damage=node.config_damage,
        config_apply_error=node.config_apply_error,
    )


def node_inventory_from_proto(view: admin_pb2.ClusterTopologyView) -> NodeInventory:
    return NodeInventory(
        nodes=tuple(node_from_proto(node) for node in view.nodes),
        spine_oversubscription=view.spine_oversubscription if view.HasField("spine_oversubscription") else None,
        spine_bandwidth_gbps=view.spine_bandwidth_gbps if view.HasField("spine_bandwidth_gbps") else None,
    )


def node_data(node: NodeInfo) -> dict[str, Any]:
    """The node as ``-o json`` prints it: its message's plain form (``plain_data.py``)."""
    return to_data(node_to_proto(node))
