"""Probe rounds: measure node-to-node bandwidth and latency for every pair, in parallel rounds.

A round over n nodes is split into about n rounds of disjoint pairs (``benchmarks.plan.probe_rounds``), so
it takes O(n) steps of parallel probes, not n(n-1)/2 serial ones. A ``sparse`` round (the default above 64
nodes) probes what the rack model cannot predict, batch by batch as `topo_tune.topology.sampling` plans it
(rack rings, rack-pair samples, escalation around outliers), each batch in rounds of disjoint pairs; the
pairs it leaves out are inferred where the matrix is built, and the round names the slow NICs, rack
uplinks and pairs it found. Each probe is run by the pair's agents at
two sizes (a small one for latency, a large one for bandwidth), rank 0 on the first node.

A pair's bandwidth is the rate **one direction** of its link carries, in GB/s — nccl-tests' sendrecv algbw,
and what the ``sim`` model's node-pair figure means — and, when the two directions differ, the slower one:
each agent reports a figure and the pair keeps the lower bandwidth and the higher latency. ``nccl`` agents
run a sendrecv (both directions at once, so each reports about the slower one); ``gloo`` agents time each
direction alone, since gloo's sendrecv moves one direction at a time and would read half a full-duplex link
(``topo_tune.agent.bench.benchmark_executor``). Over TCP a figure is goodput: a link shaped to R bit/s carries about
0.956 R of payload (1448-byte segments in 1514-byte frames).

Every measured pair is stored with its time and method; ``measured_pairs`` gives the newest figure of every
pair, which replaces the modelled one in the topology model and the ring-order optimizer.

A round is a background task of the controller. Its state is persisted; a round that was running when the
controller stopped is marked failed at the next start (its stored measurements stay valid). A probe that
got no result in time, or whose round ended that way, is closed ``timed_out``: a node that comes back later
is not sent it again. A probe whose one node failed or refused it, or went ``lost`` before answering, ends at
once: the other node's command is closed and a ``CancelJob`` for ``probe-<probe_id>`` sent to it
(``job_ends``), so its workers do not wait for the lost peer until the deadline.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.benchmark.job_spec import MAX_DEADLINE_S
from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound, ProbeStatus
from topo_tune.command_record import CommandStatus
from topo_tune.controller import names
from topo_tune.controller.benchmarks.plan import probe_rounds
from topo_tune.controller.changes import Changes, first_of
from topo_tune.controller.commands import CommandBook, CommandRecord
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.left_running import end_left_running
from topo_tune.controller.db.models import CommandRow, PairMeasurementRow, ProbeRoundRow
from topo_tune.controller.job_ends import OpenPart, cancel_command, cancel_command_id, why_it_cannot_finish
from topo_tune.controller.nodes import NodeRegistry
from topo_tune.controller.probe_checks import listed_pairs, refused_results
from topo_tune.errors import ConflictError, NotFoundError, ValidationError
from topo_tune.ids import NodeName
from topo_tune.nccl.backends import Backend
from topo_tune.node_record import NodeState
from topo_tune.topology.sampling import SAMPLING_MODES, PairSampler, SamplingPolicy, default_mode, pair_rounds
from topo_tune.v1 import agent_pb2

logger = logging.getLogger(__name__)

DEFAULT_MESSAGE_BYTES = 16 << 20
LATENCY_BYTES = 8
Figures = tuple[float, float]


def _close_open_probes(
    session: Session, id_prefix: str, *, now: datetime, why: str, status: CommandStatus = CommandStatus.TIMED_OUT
) -> None:
    """End the probe commands under ``id_prefix`` that are still open (``timed_out``), so none is re-sent."""
    session.execute(
        sa.update(CommandRow)
        .where(
            CommandRow.id.startswith(id_prefix, autoescape=True),
            CommandRow.kind == "probe",
            CommandRow.status.in_([s.value for s in CommandStatus if not s.final]),
        )
        .values(status=status.value, message=why, finished_at=now)
    )


def _set_progress(session: Session, *, round_id: str, progress: dict[str, object]) -> None:
    row = session.get(ProbeRoundRow, round_id)
    if row is not None:
        row.progress = progress


def _lost(node: str) -> str:
    return f"node-lost/{node}"


def _ended(found: ProbeRound) -> bool:
    return found.status is not ProbeStatus.RUNNING


def _measurement(row: PairMeasurementRow) -> PairMeasurement:
    return PairMeasurement(
        node_a=row.node_a,
        node_b=row.node_b,
        bandwidth_gbps=row.bandwidth_gbps,
        latency_us=row.latency_us,
        method=row.method,
        measured_at=row.measured_at,
    )


@dataclass
class Probes:
    db: Database
    registry: NodeRegistry
    commands: CommandBook
    deliver: Callable[[CommandRecord], Awaitable[bool]]
    wall_clock: Callable[[], datetime]
    rng: random.Random = field(default_factory=random.Random)
    port_range: tuple[int, int] = (20000, 29999)
    result_grace_s: float = 10.0
    """After a pair's deadline, how long results already on their way may still arrive."""
    sampling_policy: SamplingPolicy = field(default_factory=SamplingPolicy)
    """How sparse a ``sparse`` round is (its seed is drawn per round)."""
    changes: Changes = field(default_factory=Changes)
    """Woken where a round's measurement, progress or end is committed (`wait`, the admin API's watch)."""
    _waiters: dict[str, asyncio.Future[agent_pb2.CommandResult]] = field(default_factory=dict, init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    async def recover(self) -> int:
        """At start-up: rounds left running by a previous controller process are failed."""
        now = self.wall_clock()

        def close_probes(session: Session, row: ProbeRoundRow) -> None:
            _close_open_probes(session, f"{row.id}-", now=now, why="the controller restarted during its round")

        return await end_left_running(
            self.db,
            ProbeRoundRow,
            status="failed",
            message="the controller restarted during the round; its measured pairs are kept",
            at=now,
            also=close_probes,
        )

    async def start(self, request: ProbeRequest) -> ProbeRound:
        listed = listed_pairs(request)
        nodes = (
            sorted({n for pair in listed for n in pair})
            if listed
            else list(request.nodes) or [v.name for v in await self.registry.list() if v.state is NodeState.READY]
        )
        if len(nodes) < 2:
            raise ValidationError("nodes", "a probe round needs at least two ready nodes")
        if len(set(nodes)) != len(nodes):
            raise ValidationError("nodes", "a node is listed twice")
        if request.sampling not in ("", *SAMPLING_MODES):
            raise ValidationError("sampling", "full or sparse")
        mode: str = "listed" if listed else request.sampling or default_mode(len(nodes))
        racks = await self._probed_racks(nodes)
        if request.pair_deadline_s > MAX_DEADLINE_S:
            raise ValidationError("pair_deadline_s", f"at most {MAX_DEADLINE_S}")
        message_bytes = request.message_bytes or DEFAULT_MESSAGE_BYTES
        if message_bytes % LATENCY_BYTES or message_bytes < 2 * LATENCY_BYTES or message_bytes > (4 << 30):
            raise ValidationError("message_bytes", "a multiple of 8 between 16 bytes and 4 GiB")
        round_id = "pr-" + uuid.uuid4().hex[:12]
        now = self.wall_clock()

        def write(session: Session) -> None:
            session.add(
                ProbeRoundRow(
                    id=round_id,
                    status="running",
                    message="",
                    nodes=nodes,
                    message_bytes=message_bytes,
                    created_at=now,
                    sampling=mode,
                    progress={"pairs": len(listed), "rounds": len(pair_rounds(listed))}
                    if listed
                    else {"pairs": 0, "rounds": 0}
                    if mode == "sparse"
                    else None,
                )
            )

        await self.db.run(write)
        deadline_s = float(request.pair_deadline_s or 120)
        if mode == "sparse":
            run = self._run_sparse(round_id, racks, message_bytes=message_bytes, deadline_s=deadline_s)
        else:
            rounds = pair_rounds(listed) if listed else probe_rounds(nodes)
            run = self._run(round_id, rounds, message_bytes=message_bytes, deadline_s=deadline_s)
        task = asyncio.create_task(run)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await self.get(round_id)

    async def _probed_racks(self, nodes: list[str]) -> dict[str, str]:
        """Each node's rack, once every node is shown ready, undrained and on a real network."""
        backends: set[Backend] = set()
        racks: dict[str, str] = {}
        for i, given in enumerate(nodes):
            name = names.node_name(given, f"nodes[{i}]")
            if self.registry.state_of(name) is None:
                raise NotFoundError(f"no node named {name!r}")
            view = await self.registry.get(name)
            if view.state is not NodeState.READY or view.drained:
                raise ConflictError(
                    f"node {name} is {'drained' if view.drained else view.state.value}: it takes no probe"
                )
            backends.add(view.backend)
            racks[name] = view.rack or "default"
        if any(backend.simulated for backend in backends):
            raise ValidationError("nodes", "sim nodes have no network to probe; the model's figures stand in")
        return racks

    async def _run(
        self, round_id: str, rounds: Sequence[Sequence[tuple[str, str]]], *, message_bytes: int, deadline_s: float
    ) -> None:
        failures: list[str] = []
        try:
            for number, pairs in enumerate(rounds):
                outcomes = await self._probe_round(
                    round_id, number, pairs, message_bytes=message_bytes, deadline_s=deadline_s
                )
                failures.extend(reason for reason, _ in outcomes if reason)
        except Exception as error:
            logger.exception("probe round failed", extra={"round": round_id})
            failures.append(f"{error.__class__.__name__}: {error}")
        await self._finish(round_id, failures)

    async def _run_sparse(self, round_id: str, racks: dict[str, str], *, message_bytes: int, deadline_s: float) -> None:
        failures: list[str] = []
        sampler = PairSampler(racks, replace(self.sampling_policy, seed=self.rng.randrange(1 << 31)))
        number = 0
        try:
            while batch := sampler.next_pairs():
                for pairs in pair_rounds(batch):
                    outcomes = await self._probe_round(
                        round_id, number, pairs, message_bytes=message_bytes, deadline_s=deadline_s
                    )
                    number += 1
                    for (a, b), (reason, figures) in zip(pairs, outcomes, strict=True):
                        if figures is None:
                            sampler.failed(a, b)
                            failures.append(reason)
                        else:
                            sampler.record(a, b, *figures)
                found = sampler.findings()
                progress: dict[str, object] = {
                    "pairs": len(sampler.planned),
                    "rounds": number,
                    "degraded_nodes": list(found.degraded_nodes),
                    "degraded_uplinks": list(found.degraded_uplinks),
                    "slow_pairs": [list(pair) for pair in found.outlier_pairs],
                }
                await self.db.run(functools.partial(_set_progress, round_id=round_id, progress=progress))
                self.changes.changed(round_id)
        except Exception as error:
            logger.exception("probe round failed", extra={"round": round_id})
            failures.append(f"{error.__class__.__name__}: {error}")
        await self._finish(round_id, failures)

    async def _probe_round(
        self, round_id: str, number: int, pairs: Sequence[tuple[str, str]], *, message_bytes: int, deadline_s: float
    ) -> list[tuple[str, Figures | None]]:
        """One round of disjoint pairs, in parallel."""
        return list(
            await asyncio.gather(
                *(
                    self._probe(
                        round_id,
                        pair_id=f"{number}-{i}",
                        a=NodeName(a),  # the pair planners pair the registry's node names
                        b=NodeName(b),
                        message_bytes=message_bytes,
                        deadline_s=deadline_s,
                    )
                    for i, (a, b) in enumerate(pairs)
                )
            )
        )

    async def _finish(self, round_id: str, failures: list[str]) -> None:
        now = self.wall_clock()

        def finish(session: Session) -> None:
            row = session.get(ProbeRoundRow, round_id)
            if row is not None:
                row.status = "failed" if failures else "succeeded"
                row.message = "; ".join(failures)[:4000]
                row.finished_at = now

        await self.db.run(finish)
        self.changes.changed(round_id)
        logger.info("probe round finished", extra={"round": round_id, "failures": len(failures)})

    async def _probe(
        self, round_id: str, *, pair_id: str, a: NodeName, b: NodeName, message_bytes: int, deadline_s: float
    ) -> tuple[str, Figures | None]:
        """Probe one pair; returns ('', (bandwidth, latency)) on success, else (a reason, None)."""
        first, second = await self.registry.get(a), await self.registry.get(b)
        probe = agent_pb2.Probe(
            probe_id=f"{round_id}-{pair_id}",
            peers=[a, b],
            message_bytes=message_bytes,
            latency_bytes=LATENCY_BYTES,
            rendezvous_host=first.address or a,
            peer_rendezvous_host=second.address or b,
            rendezvous_port=self.rng.randint(*self.port_range),
        )
        results, cannot = await self._send_and_wait(probe, (a, b), deadline_s=deadline_s)
        if cannot:
            await self._cancel(probe.probe_id, (a, b), results, cannot)
            return f"{a}-{b}: {cannot}", None
        if any(result is None for result in results):
            # Otherwise a node that comes back later is sent the probe again and waits out its deadline
            # for a peer that has long moved on, holding its benchmark slot.
            closed_at = self.wall_clock()
            await self.db.run(
                lambda session: _close_open_probes(
                    session, f"{probe.probe_id}-", now=closed_at, why="the probe's deadline passed"
                )
            )
        refused = refused_results((a, b), results)
        if refused:
            return refused, None
        measured = [result.probe for result in results if result is not None]
        bandwidth = min(m.bandwidth_gbps for m in measured)  # the slower direction
        latency = max(m.latency_us for m in measured)
        how = "one-way broadcast each direction" if first.backend.one_way_probes else "sendrecv algbw"
        await self._store_pair(
            round_id,
            (a, b),
            bandwidth=bandwidth,
            latency=latency,
            method=f"{how} @ {message_bytes} B, slower direction; latency @ {LATENCY_BYTES} B",
        )
        return "", (bandwidth, latency)

    async def _send_and_wait(
        self, probe: agent_pb2.Probe, pair: tuple[NodeName, NodeName], *, deadline_s: float
    ) -> tuple[list[agent_pb2.CommandResult | None], str]:
        """Store and send the probe to both nodes, then wait for their results (see :meth:`_wait`)."""
        now = self.wall_clock()
        command = agent_pb2.Command(probe=probe, deadline_s=int(deadline_s))
        command.deadline_at.FromDatetime(now + timedelta(seconds=deadline_s))
        ids = [f"{probe.probe_id}-{rank}" for rank in (0, 1)]

        def write(session: Session) -> list[CommandRecord]:
            return [
                self.commands.add(session, node, command, command_id=cid, now=now)
                for node, cid in zip(pair, ids, strict=True)
            ]

        loop = asyncio.get_running_loop()
        for cid in ids:
            self._waiters[cid] = loop.create_future()
        try:
            for record in await self.db.run(write):
                await self.deliver(record)
            return await self._wait(ids, pair, until=time.monotonic() + deadline_s + self.result_grace_s)
        finally:
            for cid in ids:
                self._waiters.pop(cid, None)

    async def _store_pair(
        self, round_id: str, pair: tuple[str, str], *, bandwidth: float, latency: float, method: str
    ) -> None:
        at = self.wall_clock()

        def store(session: Session) -> None:
            session.add(
                PairMeasurementRow(
                    round_id=round_id,
                    node_a=pair[0],
                    node_b=pair[1],
                    bandwidth_gbps=bandwidth,
                    latency_us=latency,
                    method=method,
                    measured_at=at,
                )
            )

        await self.db.run(store)
        self.changes.changed(round_id)

    async def _wait(
        self, ids: list[str], nodes: tuple[NodeName, NodeName], *, until: float
    ) -> tuple[list[agent_pb2.CommandResult | None], str]:
        """Both results, or those in by ``until``; or as soon as the probe cannot finish, why not."""
        waiters = [self._waiters[cid] for cid in ids]
        while True:
            lost_signals = [self.changes.signal(_lost(n)) for n in nodes]  # before reading the nodes' states
            results = [w.result() if w.done() else None for w in waiters]
            parts = [OpenPart(n, r is not None, r) for n, r in zip(nodes, results, strict=True)]
            lost = {n for n in nodes if self.registry.state_of(n) is NodeState.LOST}
            cannot = why_it_cannot_finish(parts, lost) if None in results else ""
            left = until - time.monotonic()
            if cannot or None not in results or left <= 0:
                return results, cannot
            # A result, a node lost, or the deadline: whichever comes first.
            await first_of(lost_signals, [w for w in waiters if not w.done()], within_s=left)

    def nodes_lost(self, names: Sequence[str]) -> None:
        """The registry marked ``names`` lost: wake the probes waiting on them (they end at once)."""
        for name in names:
            self.changes.changed(_lost(name))

    async def _cancel(
        self, probe_id: str, nodes: tuple[NodeName, NodeName], results: list[agent_pb2.CommandResult | None], why: str
    ) -> None:
        """Close the probe's open command and send its node a cancel, in one transaction, then deliver."""
        now = self.wall_clock()
        job_id = f"probe-{probe_id}"

        def write(session: Session) -> list[CommandRecord]:
            _close_open_probes(session, f"{probe_id}-", now=now, why=f"cancelled: {why}", status=CommandStatus.FAILED)
            return [
                self.commands.add(
                    session,
                    node,
                    cancel_command(job_id, why),
                    command_id=cancel_command_id(job_id, i),
                    now=now,
                    job_id=job_id,
                )
                for i, (node, result) in enumerate(zip(nodes, results, strict=True))
                if result is None
            ]

        for record in await self.db.run(write):
            await self.deliver(record)

    async def on_result(self, node_name: NodeName, result: agent_pb2.CommandResult, job_id: str | None) -> None:
        waiter = self._waiters.get(result.command_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    async def get(self, round_id: str) -> ProbeRound:
        def read(session: Session) -> ProbeRound:
            row = session.get(ProbeRoundRow, round_id)
            if row is None:
                raise NotFoundError(f"no probe round with id {round_id!r}")
            rows = session.scalars(
                sa.select(PairMeasurementRow)
                .where(PairMeasurementRow.round_id == round_id)
                .order_by(PairMeasurementRow.id)
            )
            n = len(row.nodes)
            found = ProbeRound(
                round_id=row.id,
                status=ProbeStatus(row.status),
                message=row.message,
                nodes=tuple(row.nodes),
                measurements=tuple(_measurement(m) for m in rows),
                sampling=row.sampling,
            )
            if row.sampling == "full":
                # Every pair: n - 1 rounds for even n, n for odd (what `probe_rounds` plans).
                rounds = (n - 1 if n % 2 == 0 else n) if n > 1 else 0
                return replace(found, rounds=rounds, pairs_total=n * (n - 1) // 2)
            progress = row.progress or {}
            return replace(
                found,
                rounds=progress.get("rounds", 0),
                pairs_total=progress.get("pairs", 0),
                degraded_nodes=tuple(progress.get("degraded_nodes", [])),
                degraded_uplinks=tuple(progress.get("degraded_uplinks", [])),
                slow_pairs=tuple((a, b) for a, b in progress.get("slow_pairs", [])),
            )

        return await self.db.run(read)

    def watch(self, round_id: str) -> AsyncIterator[ProbeRound]:
        """The round now and at each change (a pair measured, more planned, the end), ending with the ended round."""
        return self.changes.follow(round_id, lambda: self.get(round_id), _ended)

    async def wait(self, round_id: str) -> ProbeRound:
        """The round once it has ended: returns at the commit of its end, with no polling."""
        return await self.changes.last(round_id, lambda: self.get(round_id), _ended)

    async def measured_pairs(self) -> list[PairMeasurement]:
        """The newest measurement of every pair."""

        def read(session: Session) -> list[PairMeasurement]:
            newest: dict[tuple[str, str], PairMeasurementRow] = {}
            for row in session.scalars(sa.select(PairMeasurementRow).order_by(PairMeasurementRow.measured_at)):
                newest[tuple(sorted((row.node_a, row.node_b)))] = row  # type: ignore[index]
            return [_measurement(r) for _, r in sorted(newest.items())]

        return await self.db.run(read)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
