"""A command for an agent in the words both the controller and the admin client use: its status, what an operator
sends (``NodeCommand``) and what an operator reads back (``CommandInfo``).

The controller's ``commands.py`` moves commands through these statuses; the admin client sends a ``NodeCommand``
and hands a ``CommandInfo`` to the CLI; ``wire/commands.py`` converts both to and from the admin API's messages.
Non-goals: storing or delivering commands (``controller/commands.py``), the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from topo_tune.ids import NodeName
from topo_tune.v1 import agent_pb2

__all__ = ["CommandInfo", "CommandStatus", "NodeCommand"]


class CommandStatus(StrEnum):
    PENDING = "pending"
    SENT = "sent"
    ACKED = "acked"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    REJECTED = "rejected"

    @property
    def final(self) -> bool:
        return self not in _OPEN


_OPEN = frozenset({CommandStatus.PENDING, CommandStatus.SENT, CommandStatus.ACKED})


class NodeCommand(StrEnum):
    """What an operator may send a node (``admin rediscover``, ``admin drain``, ``admin undrain``)."""

    REDISCOVER = "rediscover"
    DRAIN = "drain"
    UNDRAIN = "undrain"


@dataclass(frozen=True)
class CommandInfo:
    """One command as the controller reports it: where it went, where it stands, and the agent's result."""

    command_id: str
    node_name: NodeName
    kind: str
    """The command's body as the agent's protocol names it: rediscover, drain, benchmark, apply_config, …"""
    status: CommandStatus
    message: str
    deliveries: int
    """How often it was put on the wire."""
    created_at: datetime | None = None
    finished_at: datetime | None = None
    result: agent_pb2.CommandResult | None = None
    """The agent's final report, in the agent protocol's own form (a benchmark's sizes, a topology)."""
