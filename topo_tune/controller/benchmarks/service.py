"""Benchmark jobs across nodes: plan, persist, dispatch, collect, time out.

A job is planned (``plan.plan_job``: ranks contiguous per node in the requested node order,
rendezvous on rank 0's node), then stored together with one ``run_benchmark`` command per node in a single
transaction — all of it or nothing — and only then sent. Every node gets the identical ``RunBenchmark``.
When the last node's result arrives the job is summarised (slowest rank per size; wrong elements fail it)
and finished; a node's result that does not fit the job (ranks or sizes it does not have, a time that is not
a positive number) fails it, naming the node. A job still running past its deadline (plus a grace period for
results in flight) ends ``timed_out`` with the ranks that never reported; the agents kill their own workers
at the same deadline, which every command carries as an absolute time (``deadline_at``), so a command re-sent
late runs only for what is left of it. A job that cannot finish (a node failed its part, or a node that has
not reported is ``lost``) ends ``failed`` at once, and the nodes still running it are sent a cancel
(``job_ends``).

A node takes one benchmark job at a time (a job cancelled on it counts until the node confirms the cancel;
a new job waits ``cancel_wait_s`` for that), and a drained or lost node takes none. For ``sim`` nodes the
job carries the simulated cluster (the nodes' registered topologies, racks and spine) so every node
computes the same figures; such jobs are labelled simulated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobOutcome, JobStatus
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.command_record import CommandStatus
from topo_tune.controller import names
from topo_tune.controller.benchmarks import rows as stored
from topo_tune.controller.benchmarks.plan import JobNode, JobSummary, fitting, summarize
from topo_tune.controller.benchmarks.request_plan import checked_request, next_specs, one_backend, planned
from topo_tune.controller.changes import Changes, first_of
from topo_tune.controller.commands import CommandBook, CommandRecord
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import BenchmarkJobRow, CommandRow
from topo_tune.controller.job_ends import OpenPart, cancel_command, cancel_command_id, why_it_cannot_finish
from topo_tune.controller.nodes import NodeRegistry, NodeView
from topo_tune.errors import ConflictError, NodeBusy, NotFoundError
from topo_tune.ids import NodeName
from topo_tune.nccl.backends import Backend
from topo_tune.node_record import NodeState
from topo_tune.security.log_text import printable
from topo_tune.topology.gpu_ranks import gpu_ranks
from topo_tune.v1 import agent_pb2, topology_pb2
from topo_tune.wire.benchmark import spec_to_proto
from topo_tune.wire.values import timestamp

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSettings:
    default_deadline_s: float = 600.0
    result_grace_s: float = 15.0
    """After the deadline, how long results already on their way may still arrive."""
    port_range: tuple[int, int] = (20000, 29999)
    """Rendezvous ports are drawn from here (rank 0 binds it on its node)."""
    spine_oversubscription: float | None = None
    spine_ecmp_paths: int = 1
    cancel_wait_s: float = 10.0
    """How long a new job waits for its nodes to confirm the cancel of an earlier job (their workers killed)."""


@dataclass
class BenchmarkJobs:
    db: Database
    registry: NodeRegistry
    commands: CommandBook
    deliver: Callable[[list[CommandRecord]], Awaitable[int]]
    """Sends freshly stored commands to their connected nodes, all of them marked sent in one transaction."""
    wall_clock: Callable[[], datetime]
    settings: JobSettings = field(default_factory=JobSettings)
    busy_reasons: Callable[[list[str]], Awaitable[list[str]]] | None = None
    """Why nodes may not take benchmark work now (in Kubernetes: GPU pods on them); empty: all idle."""
    rng: random.Random = field(default_factory=random.Random)
    new_id: Callable[[], str] = lambda: "bj-" + uuid.uuid4().hex[:12]
    changes: Changes = field(default_factory=Changes)
    """Woken where a job's results or its end are committed (`wait`, the admin API's watch)."""

    async def start(self, request: BenchmarkRequest) -> BenchmarkJob:
        """Plan, store and dispatch a job; returns it ``running`` (or the existing one for a known id)."""
        job_id = request.job_id or self.new_id()
        if request.job_id:
            names.command_id(request.job_id, "job_id")
            existing = await self._find(job_id)
            if existing is not None:
                return existing
        spec, run, backend, nodes = await self._plan(request, job_id)
        if self.busy_reasons is not None:
            reasons = await self.busy_reasons(nodes)
            if reasons:
                raise ConflictError(f"nodes not idle for benchmarks: {'; '.join(reasons)}")
        deadline_s = float(request.deadline_s or self.settings.default_deadline_s)
        now = self.wall_clock()

        def write(session: Session) -> list[CommandRecord]:
            busy = stored.busy(session, nodes)
            if busy:
                raise NodeBusy(f"node {busy[0]} is running benchmark job {busy[1]}: one job per node at a time")
            ending = stored.ending(session, nodes)
            if ending:
                raise _StillEnding(
                    f"node {ending[0]} has not yet confirmed that it ended benchmark job {ending[1]} (cancelled)"
                )
            session.add(
                BenchmarkJobRow(
                    id=job_id,
                    status=stored.RUNNING,
                    message="",
                    backend=backend,
                    nodes=nodes,
                    spec=spec.to_json(),
                    created_at=now,
                    deadline_at=now + timedelta(seconds=deadline_s),
                )
            )
            command = agent_pb2.Command(
                run_benchmark=run,
                deadline_s=int(deadline_s),
                deadline_at=timestamp(now + timedelta(seconds=deadline_s)),
            )
            return [
                self.commands.add(session, node, command, command_id=f"{job_id}-{i}", now=now, job_id=job_id)
                for i, node in enumerate(nodes)
            ]

        records = await self._while_ending(nodes, write)  # persist the job and all its commands, then send
        await self.deliver(records)
        logger.info("benchmark job started", extra={"job": job_id, "nodes": len(nodes), "backend": backend})
        return await self.get(job_id)

    async def _while_ending(
        self, nodes: list[str], write: Callable[[Session], list[CommandRecord]]
    ) -> list[CommandRecord]:
        """``write``, once no node of the job is still ending an earlier one (a cancel not yet confirmed)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.settings.cancel_wait_s
        while True:
            signals = [self.changes.signal(_reported(n)) for n in nodes]  # before the write reads the cancels
            try:
                return await self.db.run(write)
            except _StillEnding:
                left = until - loop.time()
                if left <= 0:
                    raise
            await first_of(signals, (), within_s=left)  # a node reported (its cancel's result, perhaps): try again

    async def _plan(
        self, request: BenchmarkRequest, job_id: str
    ) -> tuple[BenchmarkSpec, agent_pb2.RunBenchmark, Backend, list[str]]:
        """The job's spec, the command every node is sent (for sim nodes with the simulated cluster), the
        nodes' backend and the nodes in rank order."""
        collective = checked_request(request)
        views = [await self._ready_node(name, f"nodes[{i}]") for i, name in enumerate(request.nodes)]
        backend = one_backend(views, cuda_graph=request.cuda_graph)
        topologies = {v.name: topology_pb2.NodeTopology.FromString(v.topology) for v in views}
        job_nodes = [
            JobNode(name=v.name, address=v.address or v.name, slots=self._slots(v, topologies[v.name], request))
            for v in views
        ]
        port = self._port()
        spec = planned(request, job_id=job_id, collective=collective, nodes=job_nodes, backend=backend, port=port)
        if request.next_specs:
            more = next_specs(request, job_id=job_id, nodes=job_nodes, backend=backend, port=self._port)
            spec = dataclasses.replace(spec, next_specs=more)
        run = spec_to_proto(spec)
        if backend.simulated:
            self._add_simulated_cluster(run, request=request, job_id=job_id, views=views, topologies=topologies)
        return spec, run, backend, list(request.nodes)

    def _port(self) -> int:
        return self.rng.randint(*self.settings.port_range)

    async def _ready_node(self, given: str, field: str) -> NodeView:
        name = names.node_name(given, field)
        if self.registry.state_of(name) is None:
            raise NotFoundError(f"no node named {name!r}")
        view = await self.registry.get(name)
        if view.state is not NodeState.READY:
            raise ConflictError(f"node {name} is {view.state.value}: it takes no benchmark job")
        if view.drained:
            raise ConflictError(f"node {name} is drained: it takes no benchmark job")
        return view

    def _add_simulated_cluster(
        self,
        run: agent_pb2.RunBenchmark,
        *,
        request: BenchmarkRequest,
        job_id: str,
        views: list[NodeView],
        topologies: dict[NodeName, topology_pb2.NodeTopology],
    ) -> None:
        run.sim.nodes.extend(topologies[view.name] for view in views)  # the views are the request's nodes, in order
        run.sim.rack_of.update({v.name: v.rack or "default" for v in views})
        if self.settings.spine_oversubscription is not None:
            run.sim.spine_oversubscription = self.settings.spine_oversubscription
        if self.settings.spine_ecmp_paths > 1:
            run.sim.spine_ecmp_paths = self.settings.spine_ecmp_paths
        run.sim.seed = request.sim_seed if request.sim_seed is not None else zlib.crc32(job_id.encode())
        for i, (more, sent) in enumerate(zip(request.next_specs, run.next_specs, strict=True)):
            sent.sim_seed = more.sim_seed if more.sim_seed is not None else zlib.crc32(f"{job_id}/{i + 1}".encode())

    @staticmethod
    def _slots(view: NodeView, topology: topology_pb2.NodeTopology, request: BenchmarkRequest) -> int:
        if view.backend.plays_nccl:
            return gpu_ranks(topology)
        return request.ranks_per_node or 1

    async def on_result(self, node_name: NodeName, result: agent_pb2.CommandResult, job_id: str | None) -> None:
        """A command finished: if it was a job's last, finish the job."""
        self.changes.changed(_reported(node_name))  # e.g. it confirmed a cancel: a job waiting for it may start
        if job_id:
            await self._finish_if_complete(job_id, timed_out=False)  # a lost node waits for the sweep

    async def recover(self) -> None:
        """At start-up: finish jobs whose every node had reported before the last controller stopped."""

        def running(session: Session) -> list[str]:
            return list(session.scalars(sa.select(BenchmarkJobRow.id).where(BenchmarkJobRow.status == stored.RUNNING)))

        lost = self._lost()
        for job_id in await self.db.run(running):
            await self._finish_if_complete(job_id, timed_out=False, lost=lost)

    def _lost(self) -> frozenset[str]:
        return self.registry.lost()

    async def sweep(self) -> list[str]:
        """Finish every job past its deadline and grace period as ``timed_out``, and every job with a node that is
        ``lost`` as ``failed``; returns the timed-out ones' ids."""
        limit = self.wall_clock() - timedelta(seconds=self.settings.result_grace_s)
        lost = self._lost()

        def read(session: Session) -> tuple[list[str], list[str]]:
            running = sa.select(BenchmarkJobRow.id, BenchmarkJobRow.nodes, BenchmarkJobRow.deadline_at).where(
                BenchmarkJobRow.status == stored.RUNNING
            )
            rows = session.execute(running).all()
            overdue = [job_id for job_id, _, deadline_at in rows if deadline_at < limit]
            stranded = [job_id for job_id, nodes, _ in rows if job_id not in overdue and lost.intersection(nodes)]
            return overdue, stranded

        overdue, stranded = await self.db.run(read)
        for job_id in overdue:
            await self._finish_if_complete(job_id, timed_out=True)
        for job_id in stranded:
            await self._finish_if_complete(job_id, timed_out=False, lost=lost)
        return overdue

    async def _finish_if_complete(self, job_id: str, *, timed_out: bool, lost: frozenset[str] = frozenset()) -> None:
        if not timed_out and not await self._may_end(job_id, lost):
            self.changes.changed(job_id)  # a node's part is committed: wake whoever follows the job's progress
            return
        now = self.wall_clock()

        def finish(session: Session) -> tuple[str, list[CommandRecord]] | None:
            job = session.get(BenchmarkJobRow, job_id, with_for_update=True)
            if job is None or job.status != stored.RUNNING:
                return None
            rows = list(
                session.scalars(
                    sa.select(CommandRow).where(CommandRow.job_id == job_id, CommandRow.kind == "run_benchmark")
                )
            )
            final = [r for r in rows if CommandStatus(r.status).final and r.result is not None]
            parts = [
                OpenPart(
                    r.node_name, r in final, agent_pb2.CommandResult.FromString(r.result or b"") if r in final else None
                )
                for r in sorted(rows, key=lambda r: job.nodes.index(r.node_name))
            ]
            cannot = "" if timed_out else why_it_cannot_finish(parts, lost)
            if len(final) < len(rows) and not timed_out and not cannot:
                return None
            status, message, outcome = _verdict(job, rows, final, timed_out=timed_out, cannot=cannot)
            job.status = status.value
            job.message = message
            job.outcome = outcome.to_json()
            job.finished_at = now
            return message, self._close_open_parts(session, job, rows, cannot=cannot, now=now)

        ended = await self.db.run(finish)
        self.changes.changed(job_id)  # a node's part (or the whole job) is committed: wake whoever waits
        if ended is None:
            return
        message, cancels = ended
        logger.info("benchmark job finished: %s", printable(message), extra={"job": job_id})  # agents' words in it
        await self.deliver(cancels)  # stored with the job's end; sent now, or when the node comes back

    async def _may_end(self, job_id: str, lost: frozenset[str]) -> bool:
        """Whether the job may end now: every part final, a part that ends the job, or a lost node.

        A narrow read off the write thread, so each of a job's results but the last costs no write
        transaction; ``finish`` decides again, in its own transaction, when this says it may.
        """

        def read(session: Session) -> list[tuple[str, str]]:
            query = sa.select(CommandRow.status, CommandRow.node_name).where(
                CommandRow.job_id == job_id, CommandRow.kind == "run_benchmark"
            )
            return [(status, node) for status, node in session.execute(query)]

        parts = await self.db.read(read)
        statuses = [CommandStatus(status) for status, _ in parts]
        return (
            not parts
            or all(s.final for s in statuses)
            or any(s.final and s is not CommandStatus.SUCCEEDED for s in statuses)
            or any(not CommandStatus(status).final and node in lost for status, node in parts)
        )

    def _close_open_parts(
        self, session: Session, job: BenchmarkJobRow, rows: list[CommandRow], *, cannot: str, now: datetime
    ) -> list[CommandRecord]:
        """Mark the ended job's unfinished commands final; where it cannot finish, queue a cancel for each."""
        cancels = []
        for row in rows:
            if CommandStatus(row.status).final:
                continue
            # Final now, so it is not sent again: a node that comes back gets the cancel instead.
            row.status = CommandStatus.FAILED if cannot else CommandStatus.TIMED_OUT
            row.message = f"cancelled: {cannot}" if cannot else "the benchmark job's deadline passed"
            row.finished_at = now
            if cannot:
                cancels.append(
                    self.commands.add(
                        session,
                        row.node_name,
                        cancel_command(job.id, cannot),
                        command_id=cancel_command_id(job.id, job.nodes.index(row.node_name)),
                        now=now,
                        job_id=job.id,
                    )
                )
        return cancels

    # -- waiting on a job (events, not polling) ----------------------------------------------------------------

    async def progress(self, job_id: str) -> JobProgress:
        """The job now, with how many of its nodes have reported."""

        def read(session: Session) -> tuple[BenchmarkJobRow | None, list[str]]:
            query = sa.select(CommandRow.status).where(CommandRow.job_id == job_id, CommandRow.kind == "run_benchmark")
            return session.get(BenchmarkJobRow, job_id), list(session.scalars(query))

        job, statuses = await self.db.read(read)
        if job is None:
            raise NotFoundError(f"no benchmark job with id {job_id!r}")
        done = sum(1 for s in statuses if CommandStatus(s).final)
        return JobProgress(stored.job_view(job), nodes_done=done, nodes_total=len(statuses))

    def watch(self, job_id: str) -> AsyncIterator[JobProgress]:
        """The job now and at each change (a node reported, the job ended), ending with the ended job."""
        return self.changes.follow(job_id, lambda: self.progress(job_id), lambda p: p.ended)

    async def wait(self, job_id: str) -> BenchmarkJob:
        """The job once it has ended: returns at the commit of its end, with no polling."""
        return (await self.changes.last(job_id, lambda: self.progress(job_id), lambda p: p.ended)).job

    async def _find(self, job_id: str) -> BenchmarkJob | None:
        try:
            return await self.get(job_id)
        except NotFoundError:
            return None

    async def get(self, job_id: str) -> BenchmarkJob:
        job = await self.db.read(lambda session: session.get(BenchmarkJobRow, job_id))
        if job is None:
            raise NotFoundError(f"no benchmark job with id {job_id!r}")
        return stored.job_view(job)

    async def list(self, *, limit: int = 50) -> list[BenchmarkJob]:
        def read(session: Session) -> list[BenchmarkJobRow]:
            query = sa.select(BenchmarkJobRow).order_by(BenchmarkJobRow.created_at.desc()).limit(limit)
            return list(session.scalars(query))

        return [stored.job_view(job) for job in await self.db.read(read)]


@dataclass(frozen=True)
class JobProgress:
    job: BenchmarkJob
    nodes_done: int
    """Nodes whose part is final (reported, or closed at the job's end)."""
    nodes_total: int

    @property
    def ended(self) -> bool:
        return self.job.status.final


def _reported(node: str) -> str:
    return f"node-reported/{node}"


class _StillEnding(NodeBusy):
    """A node has not yet confirmed the cancel of an earlier job: its workers may still be running."""


def _verdict(
    job: BenchmarkJobRow, rows: list[CommandRow], final: list[CommandRow], *, timed_out: bool, cannot: str
) -> tuple[JobStatus, str, JobOutcome]:
    """How an ending job ended, from the results its nodes sent (``final``) and why it cannot go on."""
    spec = BenchmarkSpec.from_json(job.spec)
    results = {r.node_name: fitting(spec, r.node_name, r.result or b"") for r in final}
    try:
        summary = summarize(spec, results)
    except ValueError as error:  # results that fit each node, but not each other (a size one rank lacks)
        summary = JobSummary(JobStatus.FAILED, f"job {job.id} failed: {error}", (), (), (), 0)
    open_nodes = [r.node_name for r in rows if r not in final]
    if cannot and open_nodes:
        status = JobStatus.FAILED
        message = f"job {job.id} failed: {cannot}; cancelled on {', '.join(sorted(open_nodes))}"
    else:
        status = JobStatus.TIMED_OUT if timed_out and open_nodes else summary.status
        message = (
            summary.message
            if status is summary.status
            else f"job {job.id} timed_out: no result from {', '.join(sorted(open_nodes))} by the deadline"
        )
    outcome = JobOutcome(
        sizes=summary.rows,
        missing_ranks=summary.missing_ranks,
        hung_ranks=summary.hung_ranks,
        simulated=any(r.node_benchmark.simulated for r in results.values()) or Backend(job.backend).simulated,
    )
    return status, message, outcome
