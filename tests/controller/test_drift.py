"""Drift checks against a simulated fleet on SQLite and PostgreSQL, with an injected clock (nothing sleeps).

The fleet and the rollout that makes V1 the stable version are the rollout tests' (``SimFleet``, seeded A/B
gate samples whose ``new`` arm measures about 43.5 GB/s); the check's benchmark jobs come from
``MeasuredJobs``, which answers each job as the controller's job book would, with a bus bandwidth the test
sets. The real benchmark path (a sim agent measuring the staged version) is ``test_drift_end_to_end.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from tests.controller.rollout.fleet import V1, V2, Clock, ControllerParts, SimFleet, SimVerifier, racks
from tests.support.waiting import async_wait_until
from topo_tune.benchmark.job_record import BenchmarkJob, JobStatus, SizeRange
from topo_tune.benchmark.results import SizeMeasurement
from topo_tune.config.cluster import DriftConfig, RolloutGateConfig, RolloutThresholdsConfig, parse_cluster_config
from topo_tune.controller.db.models import EventRow
from topo_tune.controller.drift import DriftCheck, DriftChecker
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.nodes import Registration
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.controller.rollout.state import RolloutPhase
from topo_tune.errors import ConfigError, NodeBusy, NotFoundError, ValidationError
from topo_tune.ids import JobId, StudyId
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.sim.node_topology import simulated_node_topology
from topo_tune.study_record import Study, StudyRequest, StudyStatus

RACKS = racks(2, 3)
REFERENCE_GBPS = 40 / (1 - 0.08)  # SimVerifier's new arm


@dataclass
class MeasuredJobs:
    """Finished benchmark jobs with the bus bandwidth set by the test; records what was asked."""

    busbw_gbps: float = REFERENCE_GBPS
    busy: str = ""
    calls: list[tuple[str, tuple[str, ...], str]] = field(default_factory=list)
    factors: list[float] = field(default_factory=list)
    """Multiply ``busbw_gbps`` by these, one per job in turn (a noisy fabric); empty: every job measures it."""

    async def order_of(self, version: str, nodes: Sequence[str]) -> tuple[str, ...]:
        return tuple(nodes)

    async def run_job(
        self, job_id: str, nodes: Sequence[str], version: str, *, measurement: RolloutGateConfig
    ) -> BenchmarkJob:
        self.calls.append((job_id, tuple(nodes), version))
        if self.busy:
            raise NodeBusy(self.busy)
        busbw = self.busbw_gbps * (self.factors[(len(self.calls) - 1) % len(self.factors)] if self.factors else 1)
        sizes = tuple(
            SizeMeasurement(
                bytes=size,
                count=size // 4,
                in_place=False,
                time_us=size / 1e3,
                algbw_gbps=0.0,
                busbw_gbps=busbw * size / 2**28,
                wrong=0,
                checked=True,
                p50_us=0.0,
                p99_us=0.0,
                cv=0.0,
            )
            for size in (1 << 20, 1 << 24, 1 << 28)
        )
        return BenchmarkJob(
            job_id=JobId(job_id),
            status=JobStatus.SUCCEEDED,
            message="",
            collective=Collective.ALL_REDUCE,
            nodes=tuple(nodes),
            world_size=len(nodes),
            dtype="float32",
            env={},
            backend=Backend.SIM,
            sizes_requested=SizeRange(1 << 20, 1 << 28, 16),
            iters=20,
            warmup_iters=5,
            cuda_graph=False,
            tuner_table_sha256="",
            created_at=datetime(2026, 1, 1, tzinfo=UTC),
            simulated=True,
            sizes=sizes,
        )


@dataclass
class StudyLog:
    """Studies as the drift checker sees them: what it asked to start."""

    started: list[StudyRequest] = field(default_factory=list)
    running: list[str] = field(default_factory=list)

    async def start(self, request: StudyRequest) -> Study:
        self.started.append(request)
        return _study(request.study_id)

    async def list(self, *, limit: int = 50) -> list[Study]:
        return [_study(s) for s in self.running]


def _study(study_id: str) -> Study:
    return Study(
        StudyId(study_id),
        StudyStatus.RUNNING,
        "",
        nodes=(),
        simulated=True,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


@dataclass
class World:
    parts: ControllerParts
    fleet: SimFleet
    clock: Clock
    jobs: MeasuredJobs
    studies: StudyLog
    metrics: ControllerMetrics
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def checker(self, **settings: object) -> DriftChecker:
        return DriftChecker(
            db=self.parts.db,
            registry=self.parts.registry,
            rollouts=self.parts.engine.store,
            verifier=self.jobs,
            studies=self.studies,
            metrics=self.metrics,
            wall_clock=self.clock.wall,
            settings=DriftConfig.model_validate(settings),
            rng=random.Random(7),
            new_id=lambda: f"dc-{next(self.ids)}",
        )

    async def complete(self, version: object = V1) -> str:
        """Roll ``version`` out (canary of one node, then rack by rack) until it is the stable version."""
        created = await self.parts.engine.create(
            version,  # type: ignore[arg-type]
            policy=PlanPolicy(canary_nodes=1),
            thresholds=RolloutThresholdsConfig(),
            actor="alice",
        )
        for _ in range(100):
            await self.fleet.tick(self.parts.registry, self.parts.commands)
            await self.parts.engine.reconcile()
            if (await self.parts.engine.store.load(created.rollout.id)).rollout.phase is RolloutPhase.COMPLETED:
                return created.rollout.id
            self.clock.advance(1)
        raise AssertionError("the rollout did not complete")


@pytest.fixture
async def world(database_url: str) -> AsyncIterator[World]:
    clock = Clock()
    parts = await ControllerParts.start(database_url, clock, SimVerifier(RACKS))
    fleet = SimFleet(RACKS)
    await fleet.register_all(parts.registry)
    yield World(parts, fleet, clock, MeasuredJobs(), StudyLog(), ControllerMetrics())
    parts.close()


def count(metrics: ControllerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_nothing_is_measured_before_a_version_is_stable_or_during_a_rollout(world: World) -> None:
    checker = world.checker()
    first = await checker.check()
    assert (first.status, first.message) == ("skipped", "no config version is active yet (no completed rollout)")
    await world.complete()
    pending = await world.parts.engine.create(
        V2, policy=PlanPolicy(), thresholds=RolloutThresholdsConfig(), actor="bob"
    )
    during = await checker.check()
    assert during.status == "skipped"
    assert f"rollout {pending.rollout.id} is active" in during.message
    assert world.jobs.calls == [], "no node of a rollout's waves is touched"
    assert count(world.metrics, "topo_tune_drift_checks_total", status="skipped") == 2


async def test_a_healthy_version_is_ok_and_a_bandwidth_drop_is_a_regression(world: World) -> None:
    rollout_id = await world.complete()
    checker = world.checker(sample_nodes=2, threshold=0.10, repeats=3)
    ok = await checker.check()
    assert ok.status == "ok", ok.message
    assert ok.config_version == V1.id and ok.rollout_id == rollout_id
    assert ok.reference_busbw_gbps == pytest.approx(REFERENCE_GBPS, rel=0.02), "the gate's new-arm mean"
    assert ok.measured_busbw_gbps == pytest.approx(REFERENCE_GBPS)
    assert len(ok.nodes) == 2 and {RACKS[n] for n in ok.nodes} == {RACKS[ok.nodes[0]]}, "two nodes of one wave"
    assert [c[0] for c in world.jobs.calls] == list(ok.job_ids) == ["dc-1-0", "dc-1-1", "dc-1-2"]
    assert {(c[1], c[2]) for c in world.jobs.calls} == {(tuple(ok.nodes), V1.id)}, "the stable version, staged"

    world.jobs.busbw_gbps = REFERENCE_GBPS * 0.85
    world.clock.advance(6 * 3600)
    regressed = await checker.check()
    assert regressed.status == "regressed"
    change = regressed.measured_busbw_gbps / regressed.reference_busbw_gbps - 1
    assert change < -0.10 and f"{change:+.1%}" in regressed.message and regressed.study_id == ""

    def drift_events(session: sa.orm.Session) -> list[tuple[str, str]]:
        rows = session.scalars(sa.select(EventRow).where(EventRow.kind == "drift.regressed"))
        return [(r.node_name, r.message.split(":")[0]) for r in rows]

    events = await world.parts.db.run(drift_events)
    assert sorted(events) == sorted((n, regressed.check_id) for n in regressed.nodes), "an event per measured node"
    assert count(world.metrics, "topo_tune_drift_regressions_total") == 1
    assert count(world.metrics, "topo_tune_drift_checks_total", status="ok") == 1

    listed = await checker.list()
    assert [c.check_id for c in listed] == [regressed.check_id, ok.check_id], "newest first"
    assert [c.check_id for c in await checker.list(status="regressed")] == [regressed.check_id]
    with pytest.raises(ValidationError, match="status"):
        await checker.list(status="bogus")
    with pytest.raises(NotFoundError):
        await checker.get("dc-404")


async def test_a_small_drop_within_the_threshold_is_ok(world: World) -> None:
    await world.complete()
    world.jobs.busbw_gbps = REFERENCE_GBPS * 0.93
    check = await world.checker(threshold=0.10).check()
    assert check.status == "ok" and -0.10 < check.measured_busbw_gbps / check.reference_busbw_gbps - 1 < 0


async def test_a_drop_beyond_the_threshold_is_a_regression_only_when_it_is_not_noise(world: World) -> None:
    await world.complete()
    checker = world.checker(threshold=0.10, alpha=0.05, repeats=3)
    world.jobs.factors = [0.55, 1.05, 1.0]  # 13% lower on average, but all over the place
    noisy = await checker.check()
    assert noisy.status == "ok", noisy.message
    assert noisy.measured_busbw_gbps < 0.9 * noisy.reference_busbw_gbps and noisy.p_value >= 0.05
    assert "beyond the -10% threshold but within noise" in noisy.message and "3 vs 10 measurements" in noisy.message

    world.jobs.factors = [0.86, 0.87, 0.87]  # as low on average, every time
    steady = await checker.check()
    assert steady.status == "regressed" and steady.p_value < 0.05 and steady.alpha == 0.05
    assert f"p = {steady.p_value:.2g} < 0.05" in steady.message


async def test_only_idle_ready_nodes_running_the_version_are_measured(world: World) -> None:
    await world.complete()
    nodes = list(RACKS)
    # Every node but two of rack-2 is busy (an agent running a command) or drained away from the version.
    keep = [n for n in nodes if RACKS[n] == "rack-2"][:2]
    for node in nodes:
        if node not in keep:
            world.parts.registry.heartbeat(node, activity="busy", applied_config_version=V1.id)
    check = await world.checker(sample_nodes=2).check()
    assert check.status == "ok" and sorted(check.nodes) == sorted(keep)

    world.parts.registry.heartbeat(keep[0], activity="idle", applied_config_version="")  # not on the version
    skipped = await world.checker(sample_nodes=2).check()
    assert skipped.status == "skipped" and "too few idle nodes" in skipped.message

    checker = world.checker(sample_nodes=1)

    async def kubernetes_busy(candidates: list[str]) -> list[str]:
        return [n for n in candidates if n != keep[1]]  # GPU pods on the last one

    checker.idle = kubernetes_busy
    assert (await checker.check()).status == "skipped"
    assert len(world.jobs.calls) == 3, "only the first check ran jobs"


async def test_a_node_taken_between_choice_and_job_fails_the_check_with_the_reason(world: World) -> None:
    await world.complete()
    world.jobs.busy = "node r1n1 is running benchmark job bj-1: one job per node at a time"
    check = await world.checker().check()
    assert check.status == "failed"
    assert "could not run" in check.message and "bj-1" in check.message


async def test_a_regression_opens_a_study_unless_one_is_running(world: World) -> None:
    await world.complete()
    world.jobs.busbw_gbps = REFERENCE_GBPS / 2
    checker = world.checker(open_study=True)
    first = await checker.check()
    assert first.status == "regressed" and first.study_id == f"drift-{first.check_id}"
    assert [r.study_id for r in world.studies.started] == [first.study_id]
    world.studies.running.append(first.study_id)
    second = await checker.check()
    assert second.study_id == "" and f"study {first.study_id} is still running" in second.message
    assert len(world.studies.started) == 1


async def test_a_changed_topology_fingerprint_is_an_event_and_a_drift_record(world: World) -> None:
    checker = world.checker(open_study=True)
    registry = replace(
        world.parts.registry,
        topology_listeners=(
            lambda change: checker.on_topology_change(
                change.node_name, before=change.before, after=change.after, version=change.applied_config_version
            ),
        ),
    )

    def registration(profile: str) -> Registration:
        topology = simulated_node_topology("r1n1", profile=profile).SerializeToString()
        return Registration("r1n1", "rack-1", {}, topology, "test", "sim", "i", V1.id, False)

    await registry.register(registration("h100-nvswitch"))
    await registry.register(registration("h100-nvswitch"))  # same hardware: nothing to say
    assert await checker.list() == []
    await registry.register(registration("pcie"))
    [changed] = await checker.list()
    assert (changed.kind, changed.status, list(changed.nodes)) == ("topology", "changed", ["r1n1"])
    assert changed.message.startswith("topology fingerprint tf1-") and changed.config_version == V1.id
    assert changed.study_id == f"drift-{changed.check_id}"

    def kinds(session: sa.orm.Session) -> list[str]:
        return list(session.scalars(sa.select(EventRow.kind).where(EventRow.node_name == "r1n1")))

    assert (await world.parts.db.run(kinds)).count("node.topology_changed") == 1
    assert count(world.metrics, "topo_tune_topology_changes_total") == 1


async def test_a_check_interrupted_by_a_restart_is_failed_at_start_up(world: World) -> None:
    await world.complete()
    checker = world.checker()
    hung = MeasuredJobs()

    async def never(job_id: str, nodes: Sequence[str], version: str, *, measurement: RolloutGateConfig) -> BenchmarkJob:
        hung.calls.append((job_id, tuple(nodes), version))
        raise KeyboardInterrupt  # the process dies mid-check: the row stays ``running``

    hung.run_job = never  # type: ignore[method-assign]
    checker.verifier = hung
    with pytest.raises(KeyboardInterrupt):
        await checker.check()
    [running] = await checker.list()
    assert running.status == "running" and running.nodes
    assert await world.checker().recover() == 1
    [failed] = await checker.list()
    assert failed.status == "failed" and "stopped during the check" in failed.message


async def test_a_check_started_on_request_measures_in_the_background_one_at_a_time(world: World) -> None:
    await world.complete()
    checker = world.checker(repeats=2)
    with pytest.raises(ValidationError, match=rf"config_version: {V2.id} is not the active version \({V1.id}\)"):
        await checker.start(version=V2.id)
    assert await checker.list() == [], "a refused request stores nothing"
    release = asyncio.Event()
    measure = world.jobs.run_job

    async def held(job_id: str, nodes: Sequence[str], version: str, *, measurement: RolloutGateConfig) -> BenchmarkJob:
        await release.wait()  # the benchmark takes its time; the request must not wait for it
        return await measure(job_id, nodes, version, measurement=measurement)

    world.jobs.run_job = held  # type: ignore[method-assign]
    started = await checker.start(version=V1.id)
    assert started.status == "running" and started.config_version == V1.id and len(started.job_ids) == 2
    second = await checker.check()  # the periodic check meanwhile: the nodes are taken
    assert second.status == "skipped" and f"drift check {started.check_id} is still running" in second.message
    release.set()

    async def finished() -> DriftCheck | None:
        check = await checker.get(started.check_id)
        return check if check.status != "running" else None

    done = await async_wait_until(finished, timeout=10, what="the requested check")
    assert done.status == "ok" and done.measured_busbw_gbps == pytest.approx(REFERENCE_GBPS)
    assert [c[0] for c in world.jobs.calls] == list(started.job_ids)


async def test_a_check_that_crashes_ends_failed_and_does_not_hold_off_the_next(world: World) -> None:
    await world.complete()
    checker = world.checker()
    measure = world.jobs.run_job

    async def broken(
        job_id: str, nodes: Sequence[str], version: str, *, measurement: RolloutGateConfig
    ) -> BenchmarkJob:
        raise RuntimeError("a bug in the job runner")

    world.jobs.run_job = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await checker.check()
    [crashed] = await checker.list()
    assert crashed.status == "failed" and "a bug in the job runner" in crashed.message
    world.jobs.run_job = measure  # type: ignore[method-assign]
    assert (await checker.check()).status == "ok"


@pytest.mark.parametrize(
    ("drift", "error"),
    [
        ({"threshold": 1.5}, "controller.drift.threshold: input should be less than 1"),
        ({"sampleNodes": 0}, "controller.drift.sampleNodes: input should be greater than or equal to 1"),
        ({"repeats": 1}, "controller.drift.repeats: input should be greater than or equal to 2"),
        ({"alpha": 0.5}, "controller.drift.alpha: input should be less than 0.5"),
    ],
)
def test_settings_name_the_bad_field(drift: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_cluster_config({"apiVersion": "topo-tune/v1", "controller": {"drift": drift}})
    assert str(raised.value) == error
