"""Commands for agents on the wire: their status in the agent protocol, an operator's ``NodeCommand`` in a send
request, and a ``CommandInfo`` ↔ the admin API's message; and a command's plain form (``-o json``).

The status table is written once and inverted; the controller's command book reads agents' results with it, its
servicers send a ``CommandInfo`` through ``command_to_proto`` and the admin client reads it back into the same.
Non-goals: validating a request (``controller/api/validation.py``), gRPC.
"""

from __future__ import annotations

from typing import Any

from topo_tune.command_record import CommandInfo, CommandStatus, NodeCommand
from topo_tune.errors import ControllerError
from topo_tune.ids import NodeName
from topo_tune.v1 import admin_pb2, agent_pb2
from topo_tune.wire.plain_data import to_data
from topo_tune.wire.values import instant_or_none, timestamp_or_none

COMMAND_STATUS_TO_WIRE: dict[CommandStatus, agent_pb2.CommandStatus.ValueType] = {
    CommandStatus.PENDING: agent_pb2.COMMAND_STATUS_PENDING,
    CommandStatus.SENT: agent_pb2.COMMAND_STATUS_SENT,
    CommandStatus.ACKED: agent_pb2.COMMAND_STATUS_ACKED,
    CommandStatus.SUCCEEDED: agent_pb2.COMMAND_STATUS_SUCCEEDED,
    CommandStatus.FAILED: agent_pb2.COMMAND_STATUS_FAILED,
    CommandStatus.TIMED_OUT: agent_pb2.COMMAND_STATUS_TIMED_OUT,
    CommandStatus.REJECTED: agent_pb2.COMMAND_STATUS_REJECTED,
}
COMMAND_STATUS_FROM_WIRE = {wire: status for status, wire in COMMAND_STATUS_TO_WIRE.items()}
if set(COMMAND_STATUS_TO_WIRE) != set(CommandStatus) or len(COMMAND_STATUS_FROM_WIRE) != len(CommandStatus):
    raise RuntimeError("every command status needs its own wire value")  # pragma: no cover - import-time check


def _set_body(request: admin_pb2.SendCommandRequest | admin_pb2.SendCommandsRequest, command: NodeCommand) -> None:
    """Put ``command`` in the request's ``body``: undrain is a drain that clears the flag."""
    if command is NodeCommand.REDISCOVER:
        request.rediscover.SetInParent()
    else:
        request.drain.CopyFrom(agent_pb2.Drain(drained=command is NodeCommand.DRAIN))


def send_command_to_proto(node: NodeName, command: NodeCommand, *, command_id: str) -> admin_pb2.SendCommandRequest:
    request = admin_pb2.SendCommandRequest(node_name=node, command_id=command_id)
    _set_body(request, command)
    return request


def send_commands_to_proto(
    nodes: list[NodeName], command: NodeCommand, *, command_id_prefix: str
) -> admin_pb2.SendCommandsRequest:
    request = admin_pb2.SendCommandsRequest(node_names=nodes, command_id_prefix=command_id_prefix)
    _set_body(request, command)
    return request


def command_from_proto(info: admin_pb2.CommandInfo) -> CommandInfo:
    status = COMMAND_STATUS_FROM_WIRE.get(info.status)
    if status is None:
        raise ControllerError(f"command {info.command_id}: the controller answered an unknown status ({info.status})")
    return CommandInfo(
        command_id=info.command_id,
        node_name=NodeName(info.node_name),
        kind=info.kind,
        status=status,
        message=info.message,
        deliveries=info.deliveries,
        created_at=instant_or_none(info, "created_at"),
        finished_at=instant_or_none(info, "finished_at"),
        result=info.result if info.HasField("result") else None,
    )


def command_to_proto(info: CommandInfo) -> admin_pb2.CommandInfo:
    return admin_pb2.CommandInfo(
        command_id=info.command_id,
        node_name=info.node_name,
        kind=info.kind,
        status=COMMAND_STATUS_TO_WIRE[info.status],
        message=info.message,
        created_at=timestamp_or_none(info.created_at),
        finished_at=timestamp_or_none(info.finished_at),
        deliveries=info.deliveries,
        result=info.result,
    )


def command_data(info: CommandInfo) -> dict[str, Any]:
    """The command as ``-o json`` prints it: its message's plain form (``plain_data.py``)."""
    return to_data(command_to_proto(info))
