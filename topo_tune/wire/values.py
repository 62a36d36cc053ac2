"""Plain values both daemons put on the wire the same way: instants as ``Timestamp``, backends as ``Backend``.

One helper per value, shared by the agent, the controller's servicers and the clients. Non-goals: messages
(each side converts its own), gRPC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from topo_tune.nccl.backends import Backend
from topo_tune.v1 import agent_pb2

BACKEND_TO_WIRE: dict[Backend, agent_pb2.Backend.ValueType] = {
    Backend.NCCL: agent_pb2.BACKEND_NCCL,
    Backend.GLOO: agent_pb2.BACKEND_GLOO,
    Backend.SIM: agent_pb2.BACKEND_SIM,
}
BACKEND_FROM_WIRE: dict[agent_pb2.Backend.ValueType, Backend] = {wire: name for name, wire in BACKEND_TO_WIRE.items()}
if set(BACKEND_TO_WIRE) != set(Backend) or set(BACKEND_FROM_WIRE) != set(agent_pb2.Backend.values()) - {
    agent_pb2.BACKEND_UNSPECIFIED
}:  # pragma: no cover - an import-time check that both mappings are total
    raise RuntimeError("every Backend needs its wire value, and every wire value its Backend")


def backend_to_wire(name: str) -> agent_pb2.Backend.ValueType:
    """A backend's enum value; ``BACKEND_UNSPECIFIED`` for a name the wire does not know (a stored row from
    a version that named another)."""
    known = name in set(Backend)
    return BACKEND_TO_WIRE[Backend(name)] if known else agent_pb2.BACKEND_UNSPECIFIED


def timestamp(at: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp


def timestamp_or_none(at: datetime | None) -> Timestamp | None:
    """For an optional message field: ``None`` leaves it unset."""
    return None if at is None else timestamp(at)


def timestamp_ns(at_ns: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(at_ns)
    return stamp


def instant_or_none(message: Message, field: str) -> datetime | None:
    """An optional ``Timestamp`` field of ``message`` as a UTC instant; ``None`` where it is unset."""
    stamp: Timestamp = getattr(message, field)
    return stamp.ToDatetime(UTC) if message.HasField(field) else None
