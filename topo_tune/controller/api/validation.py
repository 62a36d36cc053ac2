"""Checks on what agents and admins send, before anything is stored or acted on.

Protobuf parses whatever is well-formed on the wire: strings of any length, unknown enum numbers, missing
oneofs. These functions turn such messages into ``ValidationError`` naming the field
(``register.labels["k"]: value longer than 256 characters``), which the servicers map to
``INVALID_ARGUMENT``. They never touch the database.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.message import Message

from topo_tune.controller.api.topology_fields import check_topology
from topo_tune.controller.names import (
    MAX_LABEL_KEY,
    MAX_LABEL_VALUE,
    MAX_LABELS,
    address,
    command_id,
    labels,
    node_name,
    plain_text,
    short_text,
    token,
)
from topo_tune.errors import ValidationError
from topo_tune.topology.gpu_ranks import MAX_RANKS_PER_GPU
from topo_tune.v1 import admin_pb2, agent_pb2, topology_pb2
from topo_tune.versions.version import FILE_NAMES, MAX_FILE_BYTES

MAX_TOPOLOGY_BYTES = 1 << 20
MAX_GPUS = 1024
MAX_NICS = 512
MAX_TEXT = 64 * 1024
MAX_LIMIT = 10_000
"""The most rows one list request returns."""

TERMINAL_STATUSES = frozenset(
    {
        agent_pb2.COMMAND_STATUS_SUCCEEDED,
        agent_pb2.COMMAND_STATUS_FAILED,
        agent_pb2.COMMAND_STATUS_TIMED_OUT,
        agent_pb2.COMMAND_STATUS_REJECTED,
    }
)


_ADMIN = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
_UTF8_MOST = 4
"""Bytes a character takes at most in UTF-8: the label limits count characters."""
PUT_CONFIG_VERSION_BYTES = (
    len(FILE_NAMES) * (MAX_FILE_BYTES + 64)  # every file at its limit, with its name and the map entry's framing
    + MAX_LABELS * ((MAX_LABEL_KEY + MAX_LABEL_VALUE) * _UTF8_MOST + 16)  # the provenance at its limits
    + 1024  # the claimed id (a version id is 19 characters)
)
"""The largest ``PutConfigVersion`` request that can pass its checks (eight files, four of them learning's challenger
tables): about 8.2 MiB of the 16 MiB the server takes."""
REQUEST_BYTES: Mapping[str, int] = {f"/{_ADMIN}/PutConfigVersion": PUT_CONFIG_VERSION_BYTES}
"""Methods whose requests can legitimately be only a fraction of the server's receive limit: a body larger
than this is refused by its length, before it is parsed (``request_decoding.py``)."""


def limit(value: int, *, default: int, most: int = MAX_LIMIT) -> int:
    """A list request's ``limit``: ``default`` when unset, refused above ``most``."""
    if value > most:
        raise ValidationError("limit", f"at most {most}")
    return value or default


def enum_value(message: Message, field: str, where: str, *, allow_unspecified: bool = False) -> int:
    descriptor = message.DESCRIPTOR.fields_by_name[field].enum_type
    value: int = getattr(message, field)
    if descriptor is None:  # pragma: no cover - programming error
        raise TypeError(f"{field} is not an enum field")
    if descriptor.values_by_number.get(value) is None:
        raise ValidationError(f"{where}.{field}", f"unknown {descriptor.name} value {value}")
    if value == 0 and not allow_unspecified:
        raise ValidationError(f"{where}.{field}", f"{descriptor.name} must be set")
    return value


def register(message: agent_pb2.Register) -> agent_pb2.Register:
    node_name(message.node_name, "register.node_name")
    if message.rack:
        node_name(message.rack, "register.rack")
    labels(message.labels, "register.labels")
    plain_text(message.agent_version, "register.agent_version", limit=64)
    plain_text(message.instance_id, "register.instance_id", limit=64)
    address(message.address, "register.address")
    token(message.applied_config_version, "register.applied_config_version")
    enum_value(message, "backend", "register")
    topology_report(message.topology, "register.topology")
    return message


def topology_report(topology: topology_pb2.NodeTopology, where: str) -> None:
    """A node's topology as its agent reports it: bounded in size and count, every text field by its class."""
    if topology.ByteSize() > MAX_TOPOLOGY_BYTES:
        raise ValidationError(where, f"larger than {MAX_TOPOLOGY_BYTES} bytes")
    if len(topology.gpus) > MAX_GPUS:
        raise ValidationError(f"{where}.gpus", f"{len(topology.gpus)} GPUs, at most {MAX_GPUS}")
    if topology.ranks_per_gpu > MAX_RANKS_PER_GPU:
        raise ValidationError(
            f"{where}.ranks_per_gpu", f"{topology.ranks_per_gpu} ranks per GPU, at most {MAX_RANKS_PER_GPU}"
        )
    if len(topology.nics) > MAX_NICS:
        raise ValidationError(f"{where}.nics", f"{len(topology.nics)} NICs, at most {MAX_NICS}")
    check_topology(topology, where)


def heartbeat(message: agent_pb2.Heartbeat) -> agent_pb2.Heartbeat:
    enum_value(message, "activity", "heartbeat", allow_unspecified=True)
    token(message.applied_config_version, "heartbeat.applied_config_version")
    short_text(message.config_damage, "heartbeat.config_damage", limit=MAX_TEXT)
    if len(message.running_command_ids) > 64:
        raise ValidationError("heartbeat.running_command_ids", "more than 64 entries")
    return message


def result(message: agent_pb2.CommandResult) -> agent_pb2.CommandResult:
    command_id(message.command_id, "result.command_id")
    status = enum_value(message, "status", "result")
    if status not in TERMINAL_STATUSES:
        raise ValidationError("result.status", "a result must carry a final status")
    short_text(message.message, "result.message", limit=MAX_TEXT)
    if message.WhichOneof("payload") == "topology":  # a rediscovery's: stored as the node's topology
        topology_report(message.topology, "result.topology")
    return message


def event(message: agent_pb2.AgentEvent) -> agent_pb2.AgentEvent:
    if not message.kind:
        raise ValidationError("event.kind", "required")
    short_text(message.kind, "event.kind", limit=64)
    short_text(message.message, "event.message", limit=MAX_TEXT)
    if message.command_id:
        command_id(message.command_id, "event.command_id")
    return message


def agent_message(message: agent_pb2.AgentMessage) -> agent_pb2.AgentMessage:
    """A message of an open session, checked by its kind (the session acts on the kind)."""
    kind = message.WhichOneof("kind")
    if kind == "heartbeat":
        heartbeat(message.heartbeat)
    elif kind == "ack":
        command_id(message.ack.command_id, "ack.command_id")
    elif kind == "result":
        result(message.result)
    elif kind == "event":
        event(message.event)
    return message


MAX_FANOUT_NODES = 100_000


def send_commands(request: admin_pb2.SendCommandsRequest) -> admin_pb2.SendCommandsRequest:
    if len(request.node_names) > MAX_FANOUT_NODES:
        raise ValidationError("node_names", f"at most {MAX_FANOUT_NODES} nodes")
    seen: set[str] = set()
    for i, name in enumerate(request.node_names):
        node_name(name, f"node_names[{i}]")
        if name in seen:
            raise ValidationError(f"node_names[{i}]", f"{name!r} is listed twice")
        seen.add(name)
    if request.command_id_prefix:
        command_id(request.command_id_prefix, "command_id_prefix")
    if request.WhichOneof("body") is None:
        raise ValidationError("body", "one of rediscover, drain is required")
    return request


def send_command(request: admin_pb2.SendCommandRequest) -> admin_pb2.SendCommandRequest:
    node_name(request.node_name, "node_name")
    if request.command_id:
        command_id(request.command_id, "command_id")
    if request.WhichOneof("body") is None:
        raise ValidationError("body", "one of rediscover, drain is required")
    return request
