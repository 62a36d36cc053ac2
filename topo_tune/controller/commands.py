"""Commands for agents: persisted before they are sent, re-sent until the agent reports a final result.

Life of a command: ``pending`` (stored; the agent may be offline) → ``sent`` (on the wire; ``deliveries``
counts how often) → ``acked`` (the agent has it) → one final status (``succeeded``, ``failed``,
``timed_out``, ``rejected``). Every transition is committed before the controller acts on it. Delivery is
at-least-once: after each reconnect everything not final is sent again, and the agent's journal makes
execution at-most-once. A result for a command that is already final is acknowledged again and otherwise
ignored, which makes the agent's re-sends harmless.

A client may choose the command id (``admin`` retries then stay idempotent): the same id with the same
body returns the existing command, with another body it is a ``ConflictError``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.command_record import CommandInfo, CommandStatus
from topo_tune.controller.db.database import Database, table_of
from topo_tune.controller.db.models import CommandRow, EventRow, NodeRow
from topo_tune.controller.group_commit import GroupCommit
from topo_tune.errors import AlreadyExists, NotFoundError
from topo_tune.ids import NodeName
from topo_tune.v1 import agent_pb2
from topo_tune.wire.commands import COMMAND_STATUS_FROM_WIRE
from topo_tune.wire.values import timestamp

logger = logging.getLogger(__name__)

_OPEN = tuple(status for status in CommandStatus if not status.final)


@dataclass(frozen=True)
class CommandRecord:
    id: str
    node_name: NodeName
    kind: str
    status: CommandStatus
    message: str
    deliveries: int
    body: agent_pb2.Command
    result: agent_pb2.CommandResult | None
    created_at: datetime
    finished_at: datetime | None

    def info(self) -> CommandInfo:
        """The command as an admin reads it (its body stays here)."""
        return CommandInfo(
            command_id=self.id,
            node_name=self.node_name,
            kind=self.kind,
            status=self.status,
            message=self.message,
            deliveries=self.deliveries,
            created_at=self.created_at,
            finished_at=self.finished_at,
            result=self.result,
        )


@dataclass(frozen=True)
class Finished:
    """What happened to a reported result."""

    known: bool  # the command exists and belongs to the reporting node
    recorded: bool  # this report moved it to its final status (False for a repeat)
    job_id: str | None = None  # the benchmark job the command is part of, if any


def _pending_row(
    command: agent_pb2.Command, *, command_id: str, node_name: str, now: datetime, job_id: str | None = None
) -> CommandRow:
    """A new ``pending`` row holding ``command`` under ``command_id``, stamped with when it was stored."""
    body = agent_pb2.Command()
    body.CopyFrom(command)
    body.command_id = command_id
    body.created_at.CopyFrom(timestamp(now))
    return CommandRow(
        id=command_id,
        node_name=node_name,
        kind=command.WhichOneof("body") or "",
        job_id=job_id,
        body=body.SerializeToString(),
        status=CommandStatus.PENDING,
        deliveries=0,
        message="",
        created_at=now,
    )


def _record(row: CommandRow) -> CommandRecord:
    body = agent_pb2.Command.FromString(row.body)
    result = agent_pb2.CommandResult.FromString(row.result) if row.result is not None else None
    return CommandRecord(
        id=row.id,
        node_name=NodeName(row.node_name),
        kind=row.kind,
        status=CommandStatus(row.status),
        message=row.message,
        deliveries=row.deliveries,
        body=body,
        result=result,
        created_at=row.created_at,
        finished_at=row.finished_at,
    )


@dataclass
class CommandBook:
    """Stores commands and moves them through their life."""

    db: Database
    wall_clock: Callable[[], datetime]
    new_id: Callable[[], str] = lambda: uuid.uuid4().hex
    ignored_results_kept: int = 100
    """``result.ignored`` events kept per node: a misbehaving agent cannot fill the database with them."""
    _sent: GroupCommit[tuple[list[str], datetime], None] = field(init=False, repr=False)
    _acks: GroupCommit[tuple[str, str, datetime], bool] = field(init=False, repr=False)
    _results: GroupCommit[tuple[str, agent_pb2.CommandResult, datetime], Finished] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._sent = GroupCommit(self.db, self._mark_sent_in)
        self._acks = GroupCommit(self.db, self._acked_in)
        self._results = GroupCommit(self.db, self._finish_in)

    async def submit(self, node_name: NodeName, command: agent_pb2.Command, *, command_id: str = "") -> CommandRecord:
        """Store a new command for a node (status ``pending``), or return the same one if the id exists."""
        wanted_id = command_id or self.new_id()
        kind = command.WhichOneof("body") or ""
        wall = self.wall_clock()

        def write(session: Session) -> CommandRecord:
            return self.add(session, node_name, command, command_id=wanted_id, now=wall)

        record = await self.db.run(write)
        logger.info("command stored", extra={"node": node_name, "command": record.id, "kind": kind})
        return record

    def add(
        self,
        session: Session,
        node_name: str,
        command: agent_pb2.Command,
        *,
        command_id: str,
        now: datetime,
        job_id: str | None = None,
    ) -> CommandRecord:
        """Inside a caller's transaction: store a ``pending`` command, or return the same existing one."""
        kind = command.WhichOneof("body") or ""
        if session.get(NodeRow, node_name) is None:
            raise NotFoundError(f"no node named {node_name!r}")
        body = agent_pb2.Command()
        body.CopyFrom(command)
        body.command_id = command_id
        existing = session.get(CommandRow, command_id)
        if existing is not None:
            stored = agent_pb2.Command.FromString(existing.body)
            if (
                existing.node_name != node_name
                or stored.WhichOneof("body") != kind
                or getattr(stored, kind) != getattr(body, kind)
            ):
                raise AlreadyExists(f"command id {command_id!r} already names a different command")
            return _record(existing)
        row = _pending_row(command, command_id=command_id, node_name=node_name, now=now, job_id=job_id)
        session.add(row)
        session.flush()
        return _record(row)

    async def submit_many(
        self, node_names: Sequence[str], command: agent_pb2.Command, *, command_id_prefix: str = ""
    ) -> list[CommandRecord]:
        """One command per node, all stored in one transaction (none if any node is unknown). With a prefix
        the ids are ``PREFIX-NODE``, so a retried fan-out returns the commands it already stored."""
        wall = self.wall_clock()
        ids = [f"{command_id_prefix}-{node}" if command_id_prefix else self.new_id() for node in node_names]

        def write(session: Session) -> list[CommandRecord]:
            known = {
                name
                for chunk in _chunks(list(node_names))
                for name in session.scalars(sa.select(NodeRow.name).where(NodeRow.name.in_(chunk)))
            }
            missing = [node for node in node_names if node not in known]
            if missing:
                raise NotFoundError(
                    f"no node named {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if missing[1:] else "")
                )
            existing = _rows(session, ids)
            out: list[CommandRecord] = []
            for node, cid in zip(node_names, ids, strict=True):
                if cid in existing:  # a retried fan-out: the same command, or a conflict
                    out.append(self.add(session, node, command, command_id=cid, now=wall))
                    continue
                row = _pending_row(command, command_id=cid, node_name=node, now=wall)
                session.add(row)
                out.append(_record(row))
            session.flush()
            return out

        records = await self.db.run(write)
        logger.info("fan-out stored", extra={"nodes": len(records), "kind": command.WhichOneof("body") or ""})
        return records

    async def outstanding(self, node_name: NodeName) -> list[CommandRecord]:
        """Commands of a node that are not final, oldest first."""

        def read(session: Session) -> list[CommandRecord]:
            rows = session.scalars(
                sa.select(CommandRow)
                .where(CommandRow.node_name == node_name, CommandRow.status.in_([s.value for s in _OPEN]))
                .order_by(CommandRow.created_at, CommandRow.id)
            )
            return [_record(row) for row in rows]

        return await self.db.run(read)

    async def mark_sent(self, ids: list[str]) -> None:
        """Record that these commands are about to go on the wire (call before sending). Concurrent calls
        share transactions (a fan-out marks thousands at once)."""
        if ids:
            await self._sent.submit((ids, self.wall_clock()))

    def _mark_sent_in(self, session: Session, batch: Sequence[tuple[list[str], datetime]]) -> list[None]:
        ids = sorted({cid for ids, _ in batch for cid in ids})
        wall = max(at for _, at in batch)
        for chunk in _chunks(ids):
            session.execute(
                sa.update(CommandRow)
                .where(CommandRow.id.in_(chunk))
                .values(
                    deliveries=CommandRow.deliveries + 1,
                    sent_at=wall,
                    status=sa.case(
                        (CommandRow.status == CommandStatus.PENDING.value, CommandStatus.SENT.value),
                        else_=CommandRow.status,
                    ),
                )
            )
        return [None] * len(batch)

    async def acked(self, node_name: NodeName, command_id: str) -> bool:
        """The agent has the command. False if the command is unknown or another node's. Acknowledgements
        arriving together are committed together."""
        return await self._acks.submit((node_name, command_id, self.wall_clock()))

    def _acked_in(self, session: Session, batch: Sequence[tuple[str, str, datetime]]) -> list[bool]:
        owners = _owners(session, [cid for _, cid, _ in batch])
        out = [owners.get(command_id) == node_name for node_name, command_id, _ in batch]
        known = sorted({command_id for (_, command_id, _), ok in zip(batch, out, strict=True) if ok})
        wall = max(at for _, _, at in batch)
        for chunk in _chunks(known):  # one UPDATE for the batch: a command already further along stays
            session.execute(
                sa.update(CommandRow)
                .where(CommandRow.id.in_(chunk), CommandRow.status.in_([CommandStatus.PENDING, CommandStatus.SENT]))
                .values(status=CommandStatus.ACKED.value, acked_at=wall)
                .execution_options(synchronize_session=False)
            )
        return out

    async def finish(self, node_name: NodeName, result: agent_pb2.CommandResult) -> Finished:
        """Record a command's final result, with its effect on the node, in one transaction (shared with
        results that arrive at the same time; returns once it is committed)."""
        status = COMMAND_STATUS_FROM_WIRE[result.status]
        finished = await self._results.submit((node_name, result, self.wall_clock()))
        if finished.recorded:  # a fan-out's thousands of successes are in the commands table, not the log
            logger.log(
                logging.DEBUG if status is CommandStatus.SUCCEEDED else logging.INFO,
                "command finished",
                extra={"node": node_name, "command": result.command_id, "status": status.value},
            )
        return finished

    def _finish_in(
        self, session: Session, batch: Sequence[tuple[str, agent_pb2.CommandResult, datetime]]
    ) -> list[Finished]:
        # A few narrow reads and one executemany per table for the whole batch, in Core: a fan-out's thousands
        # of results cost no ORM object each, and the database thread holds the interpreter lock briefly.
        rows = {
            row.id: row
            for chunk in _chunks(sorted({result.command_id for _, result, _ in batch}))
            for row in session.execute(
                sa.select(
                    CommandRow.id, CommandRow.node_name, CommandRow.status, CommandRow.kind, CommandRow.job_id
                ).where(CommandRow.id.in_(chunk))
            )
        }
        drains = _drain_bodies(session, [cid for cid, row in rows.items() if row.kind == "drain"])
        out: list[Finished] = []
        finals: list[dict[str, object]] = []
        topologies: list[dict[str, object]] = []
        drained: list[dict[str, object]] = []
        finished: set[str] = set()
        for node_name, result, wall in batch:
            row = rows.get(result.command_id)
            if row is None or row.node_name != node_name:
                self._ignore(session, node_name, result.command_id, wall)
                out.append(Finished(known=False, recorded=False))
                continue
            if CommandStatus(row.status).final or row.id in finished:  # a repeat, maybe within this batch
                out.append(Finished(known=True, recorded=False, job_id=row.job_id))
                continue
            finished.add(row.id)
            status = COMMAND_STATUS_FROM_WIRE[result.status]
            finals.append(
                {
                    "command": row.id,
                    "status": status.value,
                    "message": result.message,
                    "result": result.SerializeToString(),
                    "finished_at": wall,
                }
            )
            if status is CommandStatus.SUCCEEDED:  # what a successful command changes about its node
                if row.kind == "rediscover" and result.WhichOneof("payload") == "topology":
                    topologies.append({"node": node_name, "topology": result.topology.SerializeToString()})
                elif row.id in drains:
                    drained.append({"node": node_name, "drained": drains[row.id]})
            out.append(Finished(known=True, recorded=True, job_id=row.job_id))
        connection = session.connection()
        commands, nodes = table_of(CommandRow), table_of(NodeRow)
        if finals:
            still_open = sa.or_(*(commands.c.status == status.value for status in _OPEN))  # no IN: one statement
            update = commands.update().where(commands.c.id == sa.bindparam("command"), still_open)
            connection.execute(update, finals)
        for values in (topologies, drained):
            if values:
                connection.execute(nodes.update().where(nodes.c.name == sa.bindparam("node")), values)
        return out

    def _ignore(self, session: Session, node_name: str, command_id: str, wall: datetime) -> None:
        """A result for a command this node was never sent: an event, of which only the newest few are kept."""
        session.add(
            EventRow(
                node_name=node_name,
                kind="result.ignored",
                message="result for a command this node was never sent",
                command_id=command_id,
                at=wall,
            )
        )
        session.flush()
        stale = session.scalars(
            sa.select(EventRow.id)
            .where(EventRow.node_name == node_name, EventRow.kind == "result.ignored")
            .order_by(EventRow.id.desc())
            .offset(self.ignored_results_kept)
        ).all()
        if stale:  # only the newest ones tell an operator anything new
            session.execute(sa.delete(EventRow).where(EventRow.id.in_(stale)))

    async def get(self, command_id: str) -> CommandRecord:
        row = await self.db.read(lambda session: session.get(CommandRow, command_id))
        if row is None:
            raise NotFoundError(f"no command with id {command_id!r}")
        return _record(row)

    async def get_many(self, ids: Sequence[str]) -> list[CommandRecord]:
        """The commands with these ids, in the same order, read in one transaction; unknown ids are left out."""

        def read(session: Session) -> list[CommandRecord]:
            rows: dict[str, CommandRow] = {}
            for chunk in range(0, len(ids), 500):
                query = sa.select(CommandRow).where(CommandRow.id.in_(ids[chunk : chunk + 500]))
                rows.update((row.id, row) for row in session.scalars(query))
            return [_record(rows[i]) for i in ids if i in rows]

        return await self.db.read(read)

    async def list(self, *, node_name: str = "", limit: int = 100) -> list[CommandRecord]:
        def read(session: Session) -> list[CommandRecord]:
            query = sa.select(CommandRow).order_by(CommandRow.created_at.desc(), CommandRow.id).limit(limit)
            if node_name:
                query = query.where(CommandRow.node_name == node_name)
            return [_record(row) for row in session.scalars(query)]

        return await self.db.read(read)

    async def apply_failures(self, node_name: str = "") -> dict[str, str]:
        """Node -> why its last finished ApplyConfig failed (the agent's message, with the path); nodes whose
        last finished one succeeded are left out. One node with ``node_name``, else every node."""
        failed = [s.value for s in (CommandStatus.FAILED, CommandStatus.REJECTED, CommandStatus.TIMED_OUT)]

        def read(session: Session) -> dict[str, str]:
            finished = sa.select(CommandRow.node_name, CommandRow.status, CommandRow.message, CommandRow.finished_at)
            finished = finished.where(CommandRow.kind == "apply_config", CommandRow.finished_at.is_not(None))
            if node_name:
                finished = finished.where(CommandRow.node_name == node_name)
            last: dict[str, tuple[datetime, str, str]] = {}
            for name, status, message, at in session.execute(finished):
                if at is not None and (name not in last or at > last[name][0]):
                    last[name] = (at, status, message)
            return {name: message for name, (_, status, message) in last.items() if status in failed}

        return await self.db.read(read)


def _chunks(ids: Sequence[str], size: int = 500) -> list[Sequence[str]]:
    """Ids in slices small enough for one ``IN`` (SQLite binds a limited number of parameters)."""
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _rows(session: Session, ids: Sequence[str]) -> dict[str, CommandRow]:
    """The command rows with these ids, loaded in a few queries."""
    unique = sorted(set(ids))
    return {
        row.id: row
        for chunk in _chunks(unique)
        for row in session.scalars(sa.select(CommandRow).where(CommandRow.id.in_(chunk)))
    }


def _owners(session: Session, ids: Sequence[str]) -> dict[str, str]:
    """The node of each command with one of these ids."""
    return {
        cid: node
        for chunk in _chunks(sorted(set(ids)))
        for cid, node in session.execute(sa.select(CommandRow.id, CommandRow.node_name).where(CommandRow.id.in_(chunk)))
    }


def _drain_bodies(session: Session, ids: Sequence[str]) -> dict[str, bool]:
    """Whether each of these ``drain`` commands drains its node or returns it to service."""
    return {
        cid: agent_pb2.Command.FromString(body).drain.drained
        for chunk in _chunks(ids)
        for cid, body in session.execute(sa.select(CommandRow.id, CommandRow.body).where(CommandRow.id.in_(chunk)))
    }
