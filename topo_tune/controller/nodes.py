"""The node registry: who is registered, who is alive, who is drained.

A node is ``ready`` while its agent heartbeats and ``lost`` once it has been silent longer than the
expiry; it becomes ``ready`` again when it heartbeats or registers. Those transitions are committed to the
database before anything acts on them. Heartbeats themselves are not state changes: they update memory
and are written in batches (``flush``), so 5,000 agents at one heartbeat per 10 s cost one UPDATE batch per
flush, not 500 commits per second.

After a controller restart every known node gets a fresh expiry window: its agent needs time to notice
and reconnect, and marking the whole fleet ``lost`` at start-up would be a lie.

A node that registers again with another topology fingerprint (a GPU or a NIC gone, links degraded) gets a
``node.topology_changed`` event in the same transaction, and the ``topology_listeners`` are told after it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.db.database import Database, table_of
from topo_tune.controller.db.models import EventRow, NodeRow
from topo_tune.errors import NotFoundError
from topo_tune.ids import NO_CONFIG_VERSION, ConfigVersionId, NodeName
from topo_tune.nccl.backends import Backend
from topo_tune.node_record import NodeInfo, NodeState
from topo_tune.security.log_text import LogGate, held_note, printable
from topo_tune.topology.fingerprint import topology_fingerprint
from topo_tune.v1 import topology_pb2

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    """What an agent says about itself when it (re-)registers."""

    node_name: NodeName
    rack: str
    labels: Mapping[str, str]
    topology: bytes
    agent_version: str
    backend: Backend
    instance_id: str
    applied_config_version: ConfigVersionId
    drained: bool
    address: str = ""
    """Where peers reach the node: what the agent advertised, else the address its session came from."""


@dataclass(frozen=True)
class TopologyChange:
    """A node registered again with another topology fingerprint."""

    node_name: NodeName
    before: str
    after: str
    applied_config_version: ConfigVersionId


def _fingerprint(topology: bytes) -> str:
    return topology_fingerprint(topology_pb2.NodeTopology.FromString(topology)) if topology else ""


@dataclass
class _Liveness:
    state: NodeState
    last_seen: float  # monotonic clock
    last_seen_at: datetime  # wall clock, for display and the database
    activity: str = "idle"
    applied_config_version: ConfigVersionId = NO_CONFIG_VERSION
    config_damage: str = ""
    """The agent's report that the active version's files no longer hash to its id (memory only)."""
    dirty: bool = False


@dataclass(frozen=True)
class LiveReport:
    """What a node's agent last said, from memory, for the loops that run every second."""

    state: NodeState
    applied_config_version: ConfigVersionId
    last_seen_at: datetime
    config_damage: str = ""


@dataclass(frozen=True)
class NodeView:
    """A node as admins see it: the stored row overlaid with live heartbeat data."""

    name: NodeName
    rack: str
    state: NodeState
    labels: Mapping[str, str]
    drained: bool
    activity: str
    agent_version: str
    backend: Backend
    applied_config_version: ConfigVersionId
    topology: bytes
    address: str
    registrations: int
    registered_at: datetime
    last_heartbeat_at: datetime
    config_damage: str = ""

    def info(self, *, with_topology: bool) -> NodeInfo:
        """The node in the words a tuning pass and the admin API use; its stored topology parsed where asked for."""
        topology = topology_pb2.NodeTopology.FromString(self.topology) if with_topology and self.topology else None
        return NodeInfo(
            name=self.name,
            rack=self.rack,
            state=self.state,
            backend=self.backend,
            registrations=self.registrations,
            last_heartbeat_at=self.last_heartbeat_at,
            labels=dict(self.labels),
            topology=topology,
            registered_at=self.registered_at,
            agent_version=self.agent_version,
            address=self.address,
            drained=self.drained,
            activity=self.activity,
            applied_config_version=self.applied_config_version,
            config_damage=self.config_damage,
        )


@dataclass
class NodeRegistry:
    """Registered nodes, their liveness, and the transitions between ``ready`` and ``lost``."""

    db: Database
    expiry_s: float
    clock: Callable[[], float]
    wall_clock: Callable[[], datetime]
    rack_of: Mapping[str, str] = field(default_factory=dict)
    topology_listeners: Sequence[Callable[[TopologyChange], Awaitable[None]]] = ()
    """Told, after the registration is committed, about a node whose topology fingerprint changed."""
    log_gate: LogGate = field(default_factory=LogGate)
    """How often a node's reports of damage are logged."""
    _live: dict[NodeName, _Liveness] = field(default_factory=dict, init=False)
    _lost: set[NodeName] = field(default_factory=set, init=False)
    """The names whose state is ``lost``: the loops that want them every second need not walk the fleet."""

    async def load(self) -> int:
        """Read the registry from the database; every node starts a fresh expiry window."""

        def read(session: Session) -> list[tuple[NodeName, str, ConfigVersionId]]:
            rows = session.execute(sa.select(NodeRow.name, NodeRow.state, NodeRow.applied_config_version))
            return [(NodeName(r[0]), r[1], ConfigVersionId(r[2])) for r in rows]

        now, wall = self.clock(), self.wall_clock()
        for name, state, version in await self.db.run(read):
            self._live[name] = _Liveness(NodeState(state), now, wall, applied_config_version=version)
            if state == NodeState.LOST:
                self._lost.add(name)
        return len(self._live)

    def rack_for(self, registration: Registration) -> str:
        # The operator's cluster.yaml is the source of truth; the agent's own --rack fills gaps.
        return self.rack_of.get(registration.node_name, registration.rack)

    async def register(self, registration: Registration) -> NodeView:
        now, wall = self.clock(), self.wall_clock()
        rack = self.rack_for(registration)

        def upsert(session: Session) -> tuple[NodeView, TopologyChange | None]:
            row = session.get(NodeRow, registration.node_name)
            change = None
            if row is None:
                row = NodeRow(name=registration.node_name, registrations=0, registered_at=wall, state_changed_at=wall)
                session.add(row)
            elif row.topology and registration.topology and row.topology != registration.topology:
                before, after = _fingerprint(row.topology), _fingerprint(registration.topology)
                if before != after:  # the same hardware listed another way is no change
                    change = TopologyChange(registration.node_name, before, after, registration.applied_config_version)
                    message = f"topology fingerprint {before} -> {after}"
                    session.add(EventRow(node_name=row.name, kind="node.topology_changed", message=message, at=wall))
            if row.state != NodeState.READY:
                row.state_changed_at = wall
            row.state = NodeState.READY
            row.rack = rack
            row.labels = dict(registration.labels)
            row.topology = registration.topology
            row.agent_version = registration.agent_version
            row.backend = registration.backend
            row.instance_id = registration.instance_id
            row.applied_config_version = registration.applied_config_version
            row.drained = registration.drained
            row.address = registration.address
            row.activity = "drained" if registration.drained else "idle"
            row.registrations = (row.registrations or 0) + 1
            row.registered_at = wall
            row.last_heartbeat_at = wall
            session.add(EventRow(node_name=row.name, kind="node.registered", message=f"rack {rack!r}", at=wall))
            session.flush()
            return _view(row, None), change

        view, change = await self.db.run(upsert)
        self._lost.discard(registration.node_name)
        self._live[registration.node_name] = _Liveness(
            NodeState.READY,
            now,
            wall,
            activity=view.activity,
            applied_config_version=registration.applied_config_version,
        )
        logger.info("node registered", extra={"node": registration.node_name, "rack": rack})
        if change is not None:
            for listener in self.topology_listeners:
                await listener(change)
        return view

    def heartbeat(
        self, name: NodeName, *, activity: str, applied_config_version: ConfigVersionId, config_damage: str = ""
    ) -> bool:
        """Record a heartbeat in memory. True when the node was ``lost`` and must be marked ready."""
        live = self._live.get(name)
        if live is None:
            return False
        live.last_seen, live.last_seen_at = self.clock(), self.wall_clock()
        live.activity = activity
        live.applied_config_version = applied_config_version
        if config_damage != live.config_damage:
            held = self.log_gate.admit(name, "config_damage") if config_damage else None
            if held is not None:  # the agent's text: escaped, bounded, a few lines a minute per node
                logger.error(
                    "active config version damaged: %s%s",
                    printable(config_damage),
                    held_note(held),
                    extra={"node": name},
                )
            live.config_damage = config_damage
        live.dirty = True
        return live.state is NodeState.LOST

    async def mark_ready(self, name: NodeName) -> None:
        await self._transition([name], NodeState.READY, "node.ready", "heartbeats resumed")

    async def sweep(self) -> list[NodeName]:
        """Mark every node silent for longer than the expiry ``lost``; returns their names."""
        now = self.clock()
        expired = [
            name
            for name, live in self._live.items()
            if live.state is NodeState.READY and now - live.last_seen > self.expiry_s
        ]
        if expired:
            await self._transition(expired, NodeState.LOST, "node.lost", f"no heartbeat for {self.expiry_s:g} s")
            for name in expired:
                logger.warning("node lost", extra={"node": name})
        return expired

    async def _transition(self, names: list[NodeName], state: NodeState, kind: str, message: str) -> None:
        wall = self.wall_clock()

        def write(session: Session) -> None:
            session.execute(
                sa.update(NodeRow).where(NodeRow.name.in_(names)).values(state=state.value, state_changed_at=wall)
            )
            session.add_all(EventRow(node_name=n, kind=kind, message=message, at=wall) for n in names)

        await self.db.run(write)  # persist, then act
        for name in names:
            if (live := self._live.get(name)) is not None:
                live.state = state
                if state is NodeState.LOST:
                    self._lost.add(name)
                else:
                    self._lost.discard(name)

    async def flush(self) -> int:
        """Write the heartbeats seen since the last flush; returns how many nodes were written."""
        dirty = {n: live for n, live in self._live.items() if live.dirty}
        if not dirty:
            return 0
        params = [
            {
                "node": n,
                "last_heartbeat_at": live.last_seen_at,
                "activity": live.activity,
                "applied_config_version": live.applied_config_version,
            }
            for n, live in dirty.items()
        ]
        # Core, not the ORM's bulk UPDATE: one executemany without per-row ORM bookkeeping, which at 20,000
        # nodes would hold the interpreter lock against the event loop for a large part of each flush.
        nodes = table_of(NodeRow)
        update = sa.update(nodes).where(nodes.c.name == sa.bindparam("node"))

        def write(session: Session) -> None:
            session.connection().execute(update, params)

        await self.db.run(write)
        for live in dirty.values():
            live.dirty = False
        return len(dirty)

    def state_of(self, name: NodeName) -> NodeState | None:
        live = self._live.get(name)
        return live.state if live else None

    def live_report(self, name: NodeName) -> LiveReport | None:
        """What the node last reported (state, config version, last heartbeat), without a database read."""
        live = self._live.get(name)
        if live is None:
            return None
        return LiveReport(live.state, live.applied_config_version, live.last_seen_at, live.config_damage)

    def off_version(self, version: ConfigVersionId) -> list[NodeName]:
        """The nodes, not ``lost``, that report a config version other than ``version`` or a damaged one.

        A loop that runs every second over the whole fleet: it compares fields and builds nothing per node.
        At 20,000 nodes, building a report per node each second (2,000 of them new, at one heartbeat per node
        every 10 s) fed the collector enough to stall the event loop for 20-140 ms every second.
        """
        return [
            name
            for name, live in self._live.items()
            if live.state is not NodeState.LOST and (live.applied_config_version != version or live.config_damage)
        ]

    def damaged(self) -> int:
        """How many nodes report an active config version whose files no longer match its id."""
        return sum(1 for live in self._live.values() if live.config_damage)

    def lost(self) -> frozenset[NodeName]:
        """The names of the nodes that are ``lost``."""
        return frozenset(self._lost)

    def counts(self) -> dict[NodeState, int]:
        return {NodeState.READY: len(self._live) - len(self._lost), NodeState.LOST: len(self._lost)}

    async def list(self, *, rack: str = "") -> list[NodeView]:
        def read(session: Session) -> list[NodeRow]:
            query = sa.select(NodeRow).order_by(NodeRow.rack, NodeRow.name)
            if rack:
                query = query.where(NodeRow.rack == rack)
            return list(session.scalars(query))

        return [_view(row, self._live.get(NodeName(row.name))) for row in await self.db.read(read)]

    async def get(self, name: NodeName) -> NodeView:
        row = await self.db.read(lambda session: session.get(NodeRow, name))
        if row is None:
            raise NotFoundError(f"no node named {name!r}")
        return _view(row, self._live.get(name))

    def exists(self, name: NodeName) -> bool:
        return name in self._live


def _view(row: NodeRow, live: _Liveness | None) -> NodeView:
    return NodeView(
        name=NodeName(row.name),
        rack=row.rack,
        state=live.state if live else NodeState(row.state),
        labels=dict(row.labels),
        drained=row.drained,
        activity=live.activity if live else row.activity,
        agent_version=row.agent_version,
        backend=Backend(row.backend),
        applied_config_version=live.applied_config_version if live else ConfigVersionId(row.applied_config_version),
        topology=row.topology,
        address=row.address,
        registrations=row.registrations,
        registered_at=row.registered_at,
        last_heartbeat_at=max(row.last_heartbeat_at, live.last_seen_at) if live else row.last_heartbeat_at,
        config_damage=live.config_damage if live else "",
    )
