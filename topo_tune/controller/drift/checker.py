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

Non-goals: scheduling (``schedule.py`` calls :meth:`DriftChecker.check`), gating anything (a regression is a
signal to look and re-tune; nothing is rolled back), the verdict's arithmetic (``verdict.py``), the rows
(``store.py``), and deleting old checks (``retention.py``).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from statistics import fmean
from typing import Any, Protocol

from topo_tune.benchmark.job_record import BenchmarkJob
from topo_tune.config.cluster import DriftConfig, RolloutGateConfig
from topo_tune.controller.changes import Changes
from topo_tune.controller.db.database import Database
from topo_tune.controller.drift.store import DriftStore
from topo_tune.controller.drift.verdict import DriftStatus, Reference, judge
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.nodes import NodeRegistry
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.controller.rollout.verification import job_sample
from topo_tune.drift_record import DriftCheck
from topo_tune.errors import TopoTuneError, ValidationError
from topo_tune.ids import NO_CONFIG_VERSION, ConfigVersionId, NodeName, RolloutId
from topo_tune.node_record import NodeState
from topo_tune.study_record import Study, StudyRequest, StudyStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Planned:
    """What a stored ``running`` check measures."""

    version: ConfigVersionId
    reference: Reference
    nodes: tuple[str, ...]
    job_ids: tuple[str, ...]
    measurement: RolloutGateConfig


class VerificationJobs(Protocol):
    """What drift checks need to run the gates' benchmark (``verification.BenchmarkVerifier``)."""

    async def run_job(
        self, job_id: str, nodes: Sequence[str], version: ConfigVersionId, *, measurement: RolloutGateConfig
    ) -> BenchmarkJob: ...

    async def order_of(self, version: ConfigVersionId, nodes: Sequence[str]) -> tuple[str, ...]:
        """The rank order of ``nodes`` that ``version``'s gate jobs run in."""


class StudyStarter(Protocol):
    """What drift checks need of the controller's studies."""

    async def start(self, request: StudyRequest) -> Study: ...

    async def list(self, *, limit: int = 50) -> list[Study]: ...


@dataclass
class DriftChecker:
    db: Database
    registry: NodeRegistry
    rollouts: RolloutStore
    verifier: VerificationJobs
    studies: StudyStarter
    metrics: ControllerMetrics
    wall_clock: Callable[[], datetime]
    settings: DriftConfig = field(default_factory=DriftConfig)
    idle: Callable[[list[NodeName]], Awaitable[list[NodeName]]] | None = None
    """The idle subset of the given nodes (Kubernetes: no GPU pods, not cordoned); None: all are idle."""
    rng: random.Random = field(default_factory=random.Random)
    new_id: Callable[[], str] = lambda: "dc-" + uuid.uuid4().hex[:12]
    changes: Changes = field(default_factory=Changes)
    """Woken where a check's job ends or its verdict is committed (the admin API's watch)."""
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set, init=False)
    store: DriftStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = DriftStore(self.db, self.wall_clock)

    async def check(self, *, version: str = "") -> DriftCheck:
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

    async def start(self, *, version: str = "") -> DriftCheck:
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
        return await self.store.recover()

    async def _prepare(self, check_id: str, *, expected: str) -> _Planned | None:
        """Store the check: ``skipped`` with the reason (None), or ``running`` with what it will measure."""
        version, skipped = NO_CONFIG_VERSION, ""
        active = await self.rollouts.active()
        stable = await self.rollouts.stable()
        if expected and (stable is None or stable.config_version != expected):
            now_active = stable.config_version if stable is not None else "none yet"
            raise ValidationError(
                "config_version",
                f"{expected} is not the active version ({now_active}): a drift check measures what the nodes run",
            )
        running = await self.store.running_check()
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
        await self.store.add_running(  # persist, then start the jobs
            check_id,
            version=version,
            reference=reference,
            nodes=nodes,
            job_ids=job_ids,
            threshold=self.settings.threshold,
        )
        logger.info("drift check started on %s", ", ".join(nodes), extra={"check": check_id, "version": version})
        # Measured as the rollout's gates measured its reference.
        return _Planned(version, reference, tuple(nodes), tuple(job_ids), stable.policy.gate)

    async def _measure(self, check_id: str, planned: _Planned) -> None:
        try:
            await self._measure_and_judge(check_id, planned)
        except Exception as error:
            # A check left ``running`` would hold off every later one until the next leader's start-up.
            await self._end_failed(check_id, f"the check itself failed: {error!r}")
            raise

    async def _end_failed(self, check_id: str, reason: str) -> None:
        try:
            await self.store.end_failed(check_id, reason)
            self.changes.changed(check_id)
        except TopoTuneError:  # the database itself is away: the next leader's recover() ends it
            logger.exception("could not mark drift check %s failed", check_id, extra={"check": check_id})

    async def _measure_and_judge(self, check_id: str, planned: _Planned) -> None:
        measured: list[float] = []
        simulated = False
        failure = ""
        # In the version's order over the sampled nodes, as its gates measured the reference.
        nodes = await self.verifier.order_of(planned.version, planned.nodes)
        for repeat, job_id in enumerate(planned.job_ids):
            try:
                job = await self.verifier.run_job(job_id, nodes, planned.version, measurement=planned.measurement)
            except TopoTuneError as error:  # e.g. a node became busy between the choice and the job
                failure = f"the benchmark could not run: {error}"
                break
            self.changes.changed(check_id)  # one more of its jobs ended
            simulated = simulated or job.simulated
            sample = job_sample(job, repeat=repeat, arm="new")
            if sample is None:
                failure = f"job {job_id}: {job.message}"
                continue
            measured.append(sample.busbw_gbps)
        await self._finish(
            check_id, reference=planned.reference, measured=measured, failure=failure, simulated=simulated
        )

    async def references(self, rollout_id: RolloutId) -> list[Reference]:
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

    async def _choose(
        self, references: Sequence[Reference], version: ConfigVersionId
    ) -> tuple[Reference, list[NodeName]] | str:
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
        await self.store.add_skipped(check_id, version=version, reason=reason, threshold=self.settings.threshold)
        self.metrics.drift_checks.labels(status=DriftStatus.SKIPPED.value).inc()
        logger.info("drift check skipped: %s", reason, extra={"check": check_id})

    async def _finish(
        self, check_id: str, *, reference: Reference, measured: list[float], failure: str, simulated: bool
    ) -> None:
        verdict = judge(reference, measured, failure=failure, simulated=simulated, settings=self.settings)
        nodes = await self.store.finish(check_id, verdict, alpha=self.settings.alpha)  # then act
        self.changes.changed(check_id)
        status, message = verdict.status, verdict.message
        self.metrics.drift_checks.labels(status=status.value).inc()
        if status is DriftStatus.REGRESSED:
            self.metrics.drift_regressions.inc()
            logger.warning("drift check regressed: %s", message, extra={"check": check_id, "nodes": nodes})
            await self._open_study(check_id)
        else:
            logger.info("drift check %s: %s", status.value, message, extra={"check": check_id})

    async def on_topology_change(self, node: NodeName, *, before: str, after: str, version: ConfigVersionId) -> None:
        """A node registered again with another topology fingerprint: record it, count it, maybe re-tune."""
        check_id = self.new_id()
        await self.store.add_topology_change(check_id, node=node, before=before, after=after, version=version)
        self.metrics.topology_changes.inc()
        self.metrics.drift_checks.labels(status=DriftStatus.CHANGED.value).inc()
        logger.warning("topology changed: %s -> %s", before, after, extra={"node": node, "check": check_id})
        await self._open_study(check_id)

    async def _open_study(self, check_id: str) -> None:
        """With ``open_study``: start a study over the ready nodes unless one is running already."""
        if not self.settings.open_study:
            return
        study_id, note = "", ""
        running = [s.study_id for s in await self.studies.list() if s.status is StudyStatus.RUNNING]
        if running:
            note = f"no study opened: study {running[0]} is still running"
        else:
            try:
                study = await self.studies.start(StudyRequest(study_id=f"drift-{check_id}"))
                study_id, note = study.study_id, f"study {study.study_id} opened"
            except TopoTuneError as error:
                note = f"no study opened: {error}"

        await self.store.note_study(check_id, study_id=study_id, note=note)
        logger.info(note, extra={"check": check_id})

    async def get(self, check_id: str) -> DriftCheck:
        return await self.store.get(check_id)

    def watch(self, check_id: str) -> AsyncIterator[tuple[DriftCheck, int]]:
        """The check now and at each change (a job ended, the verdict), with how many of its jobs have ended;
        ending with the finished check."""
        return self.changes.follow(
            check_id, lambda: self.store.progress(check_id), lambda found: found[0].status != DriftStatus.RUNNING.value
        )

    async def list(self, *, limit: int = 50, status: str = "") -> builtins.list[DriftCheck]:
        return await self.store.list(limit=limit, status=status)
