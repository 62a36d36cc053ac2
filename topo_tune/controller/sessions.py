"""Live agent sessions: one per node, each with an outgoing queue, and what each agent message does.

The gRPC servicer owns the stream; this module owns the meaning. On registration the node is stored
``ready``, the session replaces any older session of the same node (a reconnect can overtake the old
stream's teardown), and every command that is not final is re-sent. Heartbeats answer with their sequence
number; acknowledgements and results move commands along (``commands.py``); a result is acknowledged to
the agent only after it is committed, so an agent never drops a result the controller has not stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from topo_tune.controller.commands import CommandBook, CommandRecord
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.nodes import NodeRegistry, Registration
from topo_tune.errors import ValidationError
from topo_tune.ids import ConfigVersionId, NodeName
from topo_tune.security.log_text import LogGate, held_note, printable
from topo_tune.v1 import agent_pb2
from topo_tune.wire.values import BACKEND_FROM_WIRE

logger = logging.getLogger(__name__)

ACTIVITY_NAMES = {
    agent_pb2.AGENT_ACTIVITY_UNSPECIFIED: "idle",
    agent_pb2.AGENT_ACTIVITY_IDLE: "idle",
    agent_pb2.AGENT_ACTIVITY_BUSY: "busy",
    agent_pb2.AGENT_ACTIVITY_DRAINED: "drained",
}


@dataclass(eq=False)
class AgentSession:
    node_name: NodeName
    instance_id: str
    outgoing: asyncio.Queue[agent_pb2.ControllerMessage | None] = field(default_factory=asyncio.Queue)
    close_reason: str = ""
    credential_id: str = ""
    """The issued credential the session registered with ("" for the admin token or a reviewed pod token)."""
    denied: bool = False
    """Closed because its credential was revoked: the stream ends PERMISSION_DENIED, not UNAVAILABLE."""
    sent_commands: set[str] = field(default_factory=set)
    """Commands already put on this stream: a stream is reliable, so each goes out once per session."""

    def send(self, message: agent_pb2.ControllerMessage) -> None:
        self.outgoing.put_nowait(message)

    def close(self, reason: str) -> None:
        self.close_reason = reason
        self.outgoing.put_nowait(None)


@dataclass
class SessionHub:
    registry: NodeRegistry
    commands: CommandBook
    metrics: ControllerMetrics
    heartbeat_interval_ms: int
    controller_id: str
    fanout_window: int = 512
    """Nodes `deliver_many` sends to at once."""
    result_listeners: Sequence[Callable[[NodeName, agent_pb2.CommandResult, str | None], Awaitable[None]]] = ()
    """Called with (node, result, the command's job id or None) after a result is committed for the first time."""
    log_gate: LogGate = field(default_factory=LogGate)
    """How often a node's events are logged."""
    _sessions: dict[str, AgentSession] = field(default_factory=dict, init=False)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict, init=False)

    def _lock(self, node_name: NodeName) -> asyncio.Lock:
        return self._locks.setdefault(node_name, asyncio.Lock())

    async def open(
        self, register: agent_pb2.Register, *, peer_host: str = ""
    ) -> tuple[AgentSession, agent_pb2.ControllerMessage]:
        """Register the node and open its session; returns the session and the ``Registered`` reply.

        ``peer_host`` is the address the session came from: the node's benchmark address unless the agent
        advertised one. ``register`` was checked by the servicer (``api/validation.register``)."""
        registration = Registration(
            node_name=NodeName(register.node_name),
            rack=register.rack,
            labels=dict(register.labels),
            topology=register.topology.SerializeToString(),
            agent_version=register.agent_version,
            backend=BACKEND_FROM_WIRE[register.backend],
            instance_id=register.instance_id,
            applied_config_version=ConfigVersionId(register.applied_config_version),
            drained=register.drained,
            address=register.address or peer_host,
        )
        view = await self.registry.register(registration)
        session = AgentSession(registration.node_name, register.instance_id)
        previous = self._sessions.get(register.node_name)
        if previous is not None:
            previous.close("superseded by a newer session of this node")
        self._sessions[register.node_name] = session
        self.metrics.sessions.set(len(self._sessions))
        self.metrics.registrations.inc()
        reply = agent_pb2.ControllerMessage(
            registered=agent_pb2.Registered(
                node_name=view.name,
                rack=view.rack,
                heartbeat_interval_ms=self.heartbeat_interval_ms,
                controller_id=self.controller_id,
                address=view.address,
            )
        )
        return session, reply

    async def resend_outstanding(self, session: AgentSession) -> int:
        async with self._lock(session.node_name):
            records = await self.commands.outstanding(session.node_name)
            await self._deliver(session, records)
        return len(records)

    async def deliver_new(self, record: CommandRecord) -> bool:
        """Send a freshly stored command if its node is connected. False: it waits for a reconnect."""
        session = self._sessions.get(record.node_name)
        if session is None:
            return False
        async with self._lock(record.node_name):
            await self._deliver(session, [record])
        return True

    async def deliver_many(self, records: list[CommandRecord]) -> int:
        """Send freshly stored commands to their connected nodes, ``fanout_window`` nodes at a time: each
        window's ``sent`` marks are one transaction, then its commands go on their streams at once. Returns
        how many went out; the rest wait for their nodes to reconnect."""
        fresh = [r for r in records if not r.status.final and r.deliveries == 0]
        window = max(1, self.fanout_window)
        sent = 0
        for start in range(0, len(fresh), window):
            chunk = fresh[start : start + window]
            locks = [self._lock(name) for name in sorted({r.node_name for r in chunk})]
            async with contextlib.AsyncExitStack() as held:
                for lock in locks:  # sorted: two fan-outs never wait on each other's locks in a cycle
                    await held.enter_async_context(lock)
                targets = [
                    (session, record)
                    for record in chunk
                    if (session := self._sessions.get(record.node_name)) is not None
                    and record.id not in session.sent_commands
                ]
                await self.commands.mark_sent([record.id for _, record in targets])  # persist, then send
                for session, record in targets:
                    session.sent_commands.add(record.id)
                    session.send(agent_pb2.ControllerMessage(command=record.body))
            self.metrics.commands_sent.inc(len(targets))
            sent += len(targets)
        return sent

    async def _deliver(self, session: AgentSession, records: list[CommandRecord]) -> None:
        records = [r for r in records if r.id not in session.sent_commands]
        if not records:
            return
        await self.commands.mark_sent([r.id for r in records])  # persist, then send
        for record in records:
            session.sent_commands.add(record.id)
            session.send(agent_pb2.ControllerMessage(command=record.body))
        self.metrics.commands_sent.inc(len(records))

    async def handle(self, session: AgentSession, message: agent_pb2.AgentMessage) -> None:
        """Act on one message from an agent, checked by the servicer (``api/validation.agent_message``).

        Raises ``ValidationError`` for a message of no kind, or a second registration."""
        kind = message.WhichOneof("kind")
        if kind == "heartbeat":
            heartbeat = message.heartbeat
            self.metrics.heartbeats.inc()
            was_lost = self.registry.heartbeat(
                session.node_name,
                activity=ACTIVITY_NAMES[heartbeat.activity],
                applied_config_version=ConfigVersionId(heartbeat.applied_config_version),
                config_damage=heartbeat.config_damage,
            )
            if was_lost:
                await self.registry.mark_ready(session.node_name)
            session.send(agent_pb2.ControllerMessage(heartbeat_ack=agent_pb2.HeartbeatAck(seq=heartbeat.seq)))
        elif kind == "ack":
            command_id = message.ack.command_id
            known = await self.commands.acked(session.node_name, command_id)
            held = None if known else self.log_gate.admit(session.node_name, "unknown ack")
            if held is not None:  # an agent chooses how many it sends: a few lines a minute per node
                logger.warning(
                    "ack for an unknown command%s",
                    held_note(held),
                    extra={"node": session.node_name, "command": command_id},
                )
        elif kind == "result":
            result = message.result
            finished = await self.commands.finish(session.node_name, result)
            held = None if finished.known else self.log_gate.admit(session.node_name, "unknown result")
            if held is not None:
                logger.warning(
                    "result for an unknown command%s",
                    held_note(held),
                    extra={"node": session.node_name, "command": result.command_id},
                )
            # Acknowledge even unknown results: the agent would otherwise re-send them forever.
            session.send(agent_pb2.ControllerMessage(result_ack=agent_pb2.ResultAck(command_id=result.command_id)))
            if finished.recorded:
                for listener in self.result_listeners:
                    await listener(session.node_name, result, finished.job_id)
        elif kind == "event":
            event = message.event
            held = self.log_gate.admit(session.node_name, "event")
            if held is not None:  # the agent's text: escaped, bounded, a few lines a minute per node
                logger.info(
                    "agent event %s: %s%s",
                    printable(event.kind),
                    printable(event.message),
                    held_note(held),
                    extra={"node": session.node_name},
                )
        elif kind == "register":
            raise ValidationError("register", "sent twice in one session")
        else:
            raise ValidationError("kind", "message carries none of heartbeat, ack, result, event")

    def close(self, session: AgentSession) -> None:
        if self._sessions.get(session.node_name) is session:
            del self._sessions[session.node_name]
        self.metrics.sessions.set(len(self._sessions))

    def deny(self, node_name: str, *, credential_id: str, reason: str) -> None:
        """Close ``node_name``'s session if it registered with credential ``credential_id`` (now revoked)."""
        session = self._sessions.get(node_name)
        if session is not None and session.credential_id == credential_id:
            session.denied = True
            session.close(reason)

    def close_all(self, reason: str) -> None:
        for session in list(self._sessions.values()):
            session.close(reason)

    def connected(self, node_name: NodeName) -> bool:
        return node_name in self._sessions
