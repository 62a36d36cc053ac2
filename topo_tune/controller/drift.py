"""Drift checks: is the fleet's config version still as fast as when its rollout verified it?

A periodic check (leader only, scheduled by the controller) takes the stable version — the one the last
completed rollout made every node run — and its **reference**: the bus bandwidth its rollout's gates measured
for it, per wave (the mean of the gate's ``new``-arm samples, each the bandwidth at the sweep's largest size,
the A/B samples every gate stores). It picks one wave at random (seeded), samples up to ``sample_nodes`` of
that wave's nodes that are ready, not drained, idle (their agent runs nothing, and the idleness check —
Kubernetes GPU pods — finds them free) and run the version, and re-runs the gate's benchmark on them with the
version's staged ``nccl.conf``. When the bandwidth fell by more than ``threshold`` against the reference and
that drop is significant (``bandwidth_drop``: a one-sided Welch test on log bandwidth of the check's jobs
against the gate's samples, p < ``alpha``), the check ends ``regressed``: an event per node, a Prometheus
counter, and — with ``open_study`` — a new study over the ready nodes (``admin study status drift-<id>``).
A node that registers again with another topology fingerprint is recorded the same way (kind ``topology``,
status ``changed``), with the same optional study.

Each check is a row in ``drift_checks`` written ``running`` (with its nodes and job ids) before its jobs
start, and finished with the figures; its benchmark jobs are stored like any other. ``admin drift
list|show`` reads them; ``admin drift run`` starts one through the same code (:meth:`DriftChecker.start`
returns once the row is stored and measures in the background). One check measures at a time: another one
meanwhile is stored ``skipped`` naming it.

Nothing is measured while a rollout is active (every node belongs to one of its waves), while the version has
no reference (it was promoted without gate samples), or while too few nodes are idle; such a check is stored
``skipped`` with the reason, so an operator sees why nothing was measured.

Non-goals: scheduling (the controller's scheduler calls :meth:`DriftChecker.check`), gating anything (a
regression is a signal to look and re-tune; nothing is rolled back), and deleting old checks
(``retention.py``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from statistics import fmean
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.bandwidth_drop import drop_beyond
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.left_running import end_left_running
from topo_tune.controller.db.models import DriftCheckRow, EventRow
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.nodes import NodeRegistry, NodeState
from topo_tune.controller.rollout.gate_measurement import GateMeasurement
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.controller.rollout.verification import job_sample
from topo_tune.errors import NotFoundError, TopoTuneError, ValidationError
from topo_tune.v1 import admin_pb2

logger = logging.getLogger(__name__)


class DriftStatus(StrEnum):
    RUNNING = "running"
    OK = "ok"
    REGRESSED = "regressed"
    FAILED = "failed"
    """The benchmark ran but gave no usable figure (every job failed or timed out)."""
    SKIPPED = "skipped"
    """Nothing was measured: a rollout is active, no reference, too few idle nodes."""
    CHANGED = "changed"
    """A node's topology fingerprint changed when it registered again."""


class DriftKind(StrEnum):
    BENCHMARK = "benchmark"
    TOPOLOGY = "topology"


@dataclass(frozen=True)
class DriftSettings:
    interval_s: float = 6 * 3600.0
    """How often the active version is re-measured; 0 turns the periodic check off."""
    sample_nodes: int = 2
    """Nodes measured per check, all from one wave of the version's rollout (where its reference comes from)."""
    threshold: float = 0.10
    """A drop in bus bandwidth beyond this fraction of the reference is a regression."""
    open_study: bool = False
    """Open a study over the ready nodes on a regression or a changed topology."""
    repeats: int = 3
    """Benchmark jobs per check; the check's figure is their mean, and each is one sample of the test."""
    alpha: float = 0.05
    """Significance level: a drop beyond ``threshold`` is a regression only when the test says so at this
    level (an alert, not a gate: a false alarm costs a look, a missed one a slow fleet)."""

    def __post_init__(self) -> None:
        if self.interval_s < 0:
            raise ValidationError("drift.interval", f"must be >= 0 (0: off), got {self.interval_s:g}")
        if self.sample_nodes < 1:
            raise ValidationError("drift.sampleNodes", f"must be >= 1, got {self.sample_nodes}")
        if not 0 < self.threshold < 1:
            raise ValidationError("drift.threshold", f"a fraction between 0 and 1, got {self.threshold:g}")
        if self.repeats < 2:
            raise ValidationError("drift.repeats", f"must be >= 2 (a test needs a spread), got {self.repeats}")
        if not 0 < self.alpha < 0.5:
            raise ValidationError("drift.alpha", f"a significance level between 0 and 0.5, got {self.alpha:g}")


@dataclass(frozen=True)
class Reference:
    """What a rollout's gate measured for its new version on one wave."""

    rollout_id: str
    wave: int
    nodes: tuple[str, ...]
    busbw_gbps: float
    """The mean of ``samples``."""
    samples: tuple[float, ...] = ()
    """The gate's ``new``-arm figures, one per A/B repeat: the test's reference side."""


@dataclass(frozen=True)
class _Planned:
    """What a stored ``running`` check measures."""

    version: str
    reference: Reference
    nodes: tuple[str, ...]
    job_ids: tuple[str, ...]
    measurement: GateMeasurement


class VerificationJobs(Protocol):
    """What drift checks need to run the gates' benchmark (``verification.BenchmarkVerifier``)."""

    async def run_job(
        self, job_id: str, nodes: Sequence[str], version: str, *, measurement: GateMeasurement
    ) -> admin_pb2.BenchmarkJob: ...


class StudyStarter(Protocol):
    """What drift checks need of the controller's studies."""

    async def start(self, request: admin_pb2.StartStudyRequest) -> admin_pb2.StudyInfo: ...

    async def list(self, *, limit: int = 50) -> list[admin_pb2.StudyInfo]: ...


def drop_of(*, reference: float, measured: float) -> float:
    """The fraction of the reference bandwidth lost (negative: faster than the reference)."""
    return 1.0 - measured / reference


@dataclass
class DriftChecker:
    db: Database
    registry: NodeRegistry
    rollouts: RolloutStore
    verifier: VerificationJobs
    studies: StudyStarter
    metrics: ControllerMetrics
    wall_clock: Callable[[], datetime]
    settings: DriftSettings = field(default_factory=DriftSettings)
    idle: Callable[[list[str]], Awaitable[list[str]]] | None = None
    """The idle subset of the given nodes (Kubernetes: no GPU pods, not cordoned); None: all are idle."""
    rng: random.Random = field(default_factory=random.Random)
    new_id: Callable[[], str] = lambda: "dc-" + uuid.uuid4().hex[:12]
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set, init=False)

    async def check(self, *, version: str = "") -> admin_pb2.DriftCheck:
        """Run one drift check to its end and return it stored (``skipped`` with the reason when nothing could
        run). ``version``: refuse unless it is the active version (empty: whichever is)."""
        task = asyncio.current_task()
        try:
            if task is not None:
                self._tasks.add(task)
            check_id = self.new_id()
            planned = await self._prepare(check_id, expected=version)
            if planned is not None:
                await self._measure(check_id, planned)
            return await self.get(check_id)
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def start(self, *, version: str = "") -> admin_pb2.DriftCheck:
        """Begin a drift check now, as :meth:`check` does, and return it as soon as it is stored: final when
        nothing could be measured, else ``running`` while its benchmark jobs measure in the background (an
        operator's request must not wait minutes for them)."""
        check_id = self.new_id()
        planned = await self._prepare(check_id, expected=version)
        if planned is not None:
            task = asyncio.get_running_loop().create_task(self._measure(check_id, planned))
            self._tasks.add(task)
            task.add_done_callback(self._measured)
        return await self.get(check_id)

    def _measured(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a drift check failed: %r (the next leader's start-up marks it failed)", task.exception())

    async def close(self) -> None:
        """Cancel a check still measuring (a new leader marks it failed at start-up and checks again later)."""
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def recover(self) -> int:
        """At start-up: checks a previous controller was running end ``failed`` (the next check measures again)."""
        return await end_left_running(
            self.db,
            DriftCheckRow,
            status=DriftStatus.FAILED.value,
            message="the controller stopped during the check",
            at=self.wall_clock(),
        )

    async def _prepare(self, check_id: str, *, expected: str) -> _Planned | None:
        """Store the check: ``skipped`` with the reason (None), or ``running`` with what it will measure."""
        version, skipped = "", ""
        active = await self.rollouts.active()
        stable = await self.rollouts.stable()
        if expected and (stable is None or stable.config_version != expected):
            now_active = stable.config_version if stable is not None else "none yet"
            raise ValidationError(
                "config_version",
                f"{expected} is not the active version ({now_active}): a drift check measures what the nodes run",
            )
        running = await self._running_check()
        if running:
            skipped = f"drift check {running} is still running: one check measures at a time"
        elif active is not None:
            skipped = f"rollout {active.rollout.id} is active: its waves' nodes are not measured until it ends"
        elif stable is None:
            skipped = "no config version is active yet (no completed rollout)"
        else:
            version = stable.config_version
        if skipped or stable is None:
            await self._store_skipped(check_id, version=version, reason=skipped)
            return None
        references = await self.references(stable.id)
        if not references:
            reason = f"rollout {stable.id} stored no gate samples for {version}: there is no reference to compare with"
            await self._store_skipped(check_id, version=version, reason=reason)
            return None
        choice = await self._choose(references, version)
        if isinstance(choice, str):
            await self._store_skipped(check_id, version=version, reason=choice)
            return None
        reference, nodes = choice
        job_ids = [f"{check_id}-{repeat}" for repeat in range(self.settings.repeats)]
        await self._store_running(check_id, version=version, reference=reference, nodes=nodes, job_ids=job_ids)
        logger.info("drift check started on %s", ", ".join(nodes), extra={"check": check_id, "version": version})
        # Measured as the rollout's gates measured its reference.
        return _Planned(version, reference, tuple(nodes), tuple(job_ids), stable.policy.gate)

    async def _running_check(self) -> str:
        """The id of a benchmark check still measuring ("" if none): two at once would compete for nodes."""

        def read(session: Session) -> str:
            query = sa.select(DriftCheckRow.id).where(DriftCheckRow.status == DriftStatus.RUNNING.value).limit(1)
            return session.scalar(query) or ""

        return await self.db.run(read)

    async def _measure(self, check_id: str, planned: _Planned) -> None:
        try:
            await self._measure_and_judge(check_id, planned)
        except Exception as error:
            # A check left ``running`` would hold off every later one until the next leader's start-up.
            await self._end_failed(check_id, f"the check itself failed: {error!r}")
            raise

    async def _end_failed(self, check_id: str, reason: str) -> None:
        now = self.wall_clock()

        def write(session: Session) -> None:
            row = session.get(DriftCheckRow, check_id)
            if row is not None and row.status == DriftStatus.RUNNING.value:
                row.status, row.message, row.finished_at = DriftStatus.FAILED.value, reason, now

        try:
            await self.db.run(write)
        except TopoTuneError:  # the database itself is away: the next leader's recover() ends it
            logger.exception("could not mark drift check %s failed", check_id, extra={"check": check_id})

    async def _measure_and_judge(self, check_id: str, planned: _Planned) -> None:
        measured: list[float] = []
        simulated = False
        failure = ""
        for repeat, job_id in enumerate(planned.job_ids):
            try:
                job = await self.verifier.run_job(
                    job_id, planned.nodes, planned.version, measurement=planned.measurement
                )
            except TopoTuneError as error:  # e.g. a node became busy between the choice and the job
                failure = f"the benchmark could not run: {error}"
                break
            simulated = simulated or job.simulated
            sample = job_sample(job, repeat=repeat, arm="new")
            if sample is None:
                failure = f"job {job_id}: {job.message}"
                continue
            measured.append(sample.busbw_gbps)
        await self._finish(
            check_id, reference=planned.reference, measured=measured, failure=failure, simulated=simulated
        )

    async def references(self, rollout_id: str) -> list[Reference]:
        """Per wave of ``rollout_id``, the mean ``new``-arm bus bandwidth of its last gate attempt with samples."""
        snapshot = await self.rollouts.load(rollout_id)
        latest: dict[int, list[float]] = {}
        for gate in await self.rollouts.gates(rollout_id):  # ordered by wave, then attempt
            busbw = [s.busbw_gbps for s in gate.samples if s.arm == "new" and s.busbw_gbps > 0]
            if busbw:
                latest[gate.wave] = busbw
        return [
            Reference(rollout_id, wave, snapshot.waves[wave].nodes, fmean(busbw), tuple(busbw))
            for wave, busbw in sorted(latest.items())
            if wave < len(snapshot.waves) and snapshot.waves[wave].nodes
        ]

    async def _choose(self, references: Sequence[Reference], version: str) -> tuple[Reference, list[str]] | str:
        """A wave and the nodes of it to measure, or why there are none."""
        views = {v.name: v for v in await self.registry.list()}
        eligible = [
            name
            for name, v in views.items()
            if v.state is NodeState.READY
            and not v.drained
            and v.activity == "idle"
            and v.applied_config_version == version
        ]
        if self.idle is not None and eligible:
            eligible = await self.idle(eligible)
        usable = set(eligible)
        candidates = []
        for reference in references:
            wanted = min(self.settings.sample_nodes, len(reference.nodes))
            free = [n for n in reference.nodes if n in usable]
            if len(free) >= wanted:
                candidates.append((reference, free, wanted))
        if not candidates:
            return (
                f"too few idle nodes running {version} in any wave of its rollout "
                f"(need {self.settings.sample_nodes} of one wave; idle: {len(usable)})"
            )
        reference, free, wanted = self.rng.choice(candidates)
        chosen = set(self.rng.sample(free, wanted))
        return reference, [n for n in reference.nodes if n in chosen]  # the wave's rank order

    async def _store_skipped(self, check_id: str, *, version: str, reason: str) -> None:
        now = self.wall_clock()
        row = DriftCheckRow(
            id=check_id,
            kind=DriftKind.BENCHMARK.value,
            status=DriftStatus.SKIPPED.value,
            message=reason,
            config_version=version,
            nodes=[],
            job_ids=[],
            threshold=self.settings.threshold,
            created_at=now,
            finished_at=now,
        )
        await self.db.run(lambda session: session.add(row))
        self.metrics.drift_checks.labels(status=DriftStatus.SKIPPED.value).inc()
        logger.info("drift check skipped: %s", reason, extra={"check": check_id})

    async def _store_running(
        self, check_id: str, *, version: str, reference: Reference, nodes: list[str], job_ids: list[str]
    ) -> None:
        row = DriftCheckRow(
            id=check_id,
            kind=DriftKind.BENCHMARK.value,
            status=DriftStatus.RUNNING.value,
            message="",
            config_version=version,
            rollout_id=reference.rollout_id,
            wave=reference.wave,
            nodes=nodes,
            reference_busbw_gbps=reference.busbw_gbps,
            threshold=self.settings.threshold,
            job_ids=job_ids,
            created_at=self.wall_clock(),
        )
        await self.db.run(lambda session: session.add(row))  # persist, then start the jobs

    async def _finish(
        self, check_id: str, *, reference: Reference, measured: list[float], failure: str, simulated: bool
    ) -> None:
        now = self.wall_clock()
        busbw: float | None = None
        p_value: float | None = None
        if len(measured) >= 2:
            busbw = fmean(measured)
            drop = drop_of(reference=reference.busbw_gbps, measured=busbw)
            test = drop_beyond(reference.samples or (reference.busbw_gbps,), measured, margin=self.settings.threshold)
            p_value, alpha, threshold = test.p_value, self.settings.alpha, self.settings.threshold
            regressed = drop > threshold and p_value < alpha
            status = DriftStatus.REGRESSED if regressed else DriftStatus.OK
            if regressed:
                verdict = f"beyond the -{threshold:.0%} threshold, p = {p_value:.2g} < {alpha:g}"
            elif drop > threshold:
                verdict = f"beyond the -{threshold:.0%} threshold but within noise, p = {p_value:.2g} >= {alpha:g}"
            else:
                verdict = f"within the -{threshold:.0%} threshold"
            message = (
                f"bus bandwidth {busbw:.2f} GB/s vs {reference.busbw_gbps:.2f} GB/s at rollout "
                f"{reference.rollout_id} wave {reference.wave}: {-drop:+.1%} ({verdict}; "
                f"{len(measured)} vs {len(reference.samples) or 1} measurements)"
            )
            if failure:
                message += f"; {len(measured)} of {self.settings.repeats} jobs usable ({failure})"
        elif measured:
            status = DriftStatus.FAILED
            message = f"1 of {self.settings.repeats} jobs usable ({failure}): a decision needs at least 2"
        else:
            status, message = DriftStatus.FAILED, failure or "no job gave a usable figure"
        if simulated:
            message += " [simulated]"

        def write(session: Session) -> list[str]:
            row = session.get(DriftCheckRow, check_id)
            assert row is not None
            row.status, row.message, row.finished_at = status.value, message, now
            row.measured_busbw_gbps, row.simulated = busbw, simulated
            row.p_value, row.alpha = p_value, self.settings.alpha
            if status is DriftStatus.REGRESSED:
                session.add_all(
                    EventRow(node_name=node, kind="drift.regressed", message=f"{check_id}: {message}", at=now)
                    for node in row.nodes
                )
            return list(row.nodes)

        nodes = await self.db.run(write)  # the verdict and its events in one transaction, then act
        self.metrics.drift_checks.labels(status=status.value).inc()
        if status is DriftStatus.REGRESSED:
            self.metrics.drift_regressions.inc()
            logger.warning("drift check regressed: %s", message, extra={"check": check_id, "nodes": nodes})
            await self._open_study(check_id)
        else:
            logger.info("drift check %s: %s", status.value, message, extra={"check": check_id})

    async def on_topology_change(self, node: str, *, before: str, after: str, version: str) -> None:
        """A node registered again with another topology fingerprint: record it, count it, maybe re-tune."""
        check_id = self.new_id()
        now = self.wall_clock()
        row = DriftCheckRow(
            id=check_id,
            kind=DriftKind.TOPOLOGY.value,
            status=DriftStatus.CHANGED.value,
            message=f"topology fingerprint {before} -> {after}",
            config_version=version,
            nodes=[node],
            job_ids=[],
            created_at=now,
            finished_at=now,
        )
        await self.db.run(lambda session: session.add(row))
        self.metrics.topology_changes.inc()
        self.metrics.drift_checks.labels(status=DriftStatus.CHANGED.value).inc()
        logger.warning("topology changed: %s -> %s", before, after, extra={"node": node, "check": check_id})
        await self._open_study(check_id)

    async def _open_study(self, check_id: str) -> None:
        """With ``open_study``: start a study over the ready nodes unless one is running already."""
        if not self.settings.open_study:
            return
        study_id, note = "", ""
        running = [s.study_id for s in await self.studies.list() if s.status == admin_pb2.STUDY_STATUS_RUNNING]
        if running:
            note = f"no study opened: study {running[0]} is still running"
        else:
            try:
                study = await self.studies.start(admin_pb2.StartStudyRequest(study_id=f"drift-{check_id}"))
                study_id, note = study.study_id, f"study {study.study_id} opened"
            except TopoTuneError as error:
                note = f"no study opened: {error}"

        def write(session: Session) -> None:
            row = session.get(DriftCheckRow, check_id)
            if row is not None:
                row.study_id, row.message = study_id, f"{row.message}; {note}"

        await self.db.run(write)
        logger.info(note, extra={"check": check_id})

    async def get(self, check_id: str) -> admin_pb2.DriftCheck:
        row = await self.db.run(lambda session: session.get(DriftCheckRow, check_id))
        if row is None:
            raise NotFoundError(f"no drift check {check_id!r}")
        return _message(row)

    async def list(self, *, limit: int = 50, status: str = "") -> list[admin_pb2.DriftCheck]:
        if status and status not in DriftStatus.__members__.values():
            known = ", ".join(s.value for s in DriftStatus)
            raise ValidationError("status", f"one of {known}, got {status!r}")

        def read(session: Session) -> list[DriftCheckRow]:
            newest_first = (DriftCheckRow.created_at.desc(), DriftCheckRow.id.desc())
            query = sa.select(DriftCheckRow).order_by(*newest_first).limit(limit)
            if status:
                query = query.where(DriftCheckRow.status == status)
            return list(session.scalars(query))

        return [_message(row) for row in await self.db.run(read)]


def _message(row: DriftCheckRow) -> admin_pb2.DriftCheck:
    message = admin_pb2.DriftCheck(
        check_id=row.id,
        kind=row.kind,
        status=row.status,
        message=row.message,
        config_version=row.config_version,
        rollout_id=row.rollout_id,
        nodes=list(row.nodes),
        job_ids=list(row.job_ids),
        study_id=row.study_id,
        simulated=row.simulated,
    )
    message.created_at.FromDatetime(row.created_at)
    if row.wave is not None:
        message.wave = row.wave
    if row.reference_busbw_gbps is not None:
        message.reference_busbw_gbps = row.reference_busbw_gbps
    if row.measured_busbw_gbps is not None:
        message.measured_busbw_gbps = row.measured_busbw_gbps
    if row.threshold is not None:
        message.threshold = row.threshold
    if row.p_value is not None:
        message.p_value = row.p_value
    if row.alpha is not None:
        message.alpha = row.alpha
    if row.finished_at is not None:
        message.finished_at.FromDatetime(row.finished_at)
    return message
