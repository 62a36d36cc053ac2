"""Rollout persistence on SQLite and PostgreSQL: round trips, stale steps refused, first answers standing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest

from tests.controller.rollout.fleet import V1, V2, Clock, racks
from topo_tune.config.cluster import RolloutThresholdsConfig
from topo_tune.controller.db.database import Database
from topo_tune.controller.rollout import state
from topo_tune.controller.rollout.gates import GateVerdict, Outcome, Sample
from topo_tune.controller.rollout.plan import PlanPolicy, build_plan
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.controller.tenancy import Tenant
from topo_tune.errors import ConflictError, NotFoundError, PermissionDenied
from topo_tune.jobs.config import JobPin

RACKS = racks(3, 2)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url, retry_for_s=5)
    database.migrate()
    yield database
    database.close()


def new_rollout(rollout_id: str = "ro-1") -> state.Step:
    policy = PlanPolicy(canary_nodes=1, max_parallel_racks=2)
    return state.new_snapshot(
        rollout_id=rollout_id,
        config_version=V2.id,
        previous_version=V1.id,
        plan=build_plan(RACKS, policy),
        policy=policy,
        thresholds=RolloutThresholdsConfig(min_gain=0.05),
        created_by="alice",
    )


async def test_a_rollout_round_trips_and_a_stale_step_is_refused(db: Database) -> None:
    clock = Clock()
    store = RolloutStore(db=db, wall_clock=clock.wall)
    with pytest.raises(NotFoundError, match="config version"):
        await store.create(new_rollout())
    await store.versions.store(V2)
    await store.versions.store(V2)  # idempotent
    created = await store.create(new_rollout())
    loaded = await store.load("ro-1")
    assert loaded == created, "waves, node order, policy and thresholds survive the database"
    assert loaded.rollout.thresholds.min_gain == 0.05

    step = state.reconcile(loaded, {}, None, clock.wall())
    assert step is not None
    await store.commit(loaded, step)
    with pytest.raises(ConflictError, match="changed meanwhile"):
        await store.commit(loaded, step)  # computed from the old revision
    assert (await store.active()) == step.snapshot
    history = await store.history("ro-1")
    assert [(h.subject, h.after, h.actor) for h in history] == [
        ("rollout", "pending", "alice"),
        ("rollout", "applying", "engine"),
    ]
    with pytest.raises(ConflictError, match="still active"):
        await store.create(new_rollout("ro-2"))


async def test_the_first_gate_result_and_the_first_job_pin_stand(db: Database) -> None:
    clock = Clock()
    store = RolloutStore(db=db, wall_clock=clock.wall)
    await store.versions.store(V2)
    await store.create(new_rollout())
    samples = [Sample(0, "new", 1.0, 2.0, 3.0), Sample(0, "previous", 1.1, 2.1, 3.1)]
    first = GateVerdict(Outcome.SUCCESSFUL, ("fine",), pairs=1, lost_nodes=("x",))
    kept = await store.save_gate("ro-1", wave=0, attempt=1, verdict=first, samples=samples)
    again = await store.save_gate("ro-1", wave=0, attempt=1, verdict=GateVerdict(Outcome.FAILED, ("late",)), samples=[])
    assert kept == again == first
    [record] = await store.gates("ro-1")
    assert record.samples == tuple(samples), "raw samples are kept with the verdict"

    pins = await asyncio.gather(
        *(store.pin(JobPin("job-1", version, ("a", "b")), rollout_id="ro-1") for version in (V1.id, V2.id, V1.id))
    )
    assert len({p.version for p in pins}) == 1, "concurrent ranks all get the pin stored first"
    clock.advance(timedelta(days=31).total_seconds())
    await store.pin(JobPin("job-2", V2.id, ("a",)), rollout_id="ro-1")
    assert await store.prune_pins(older_than=clock.wall() - timedelta(days=30)) == 1
    assert await store.get_pin("job-1") is None and await store.get_pin("job-2") is not None


async def test_two_tenants_pinning_arms_of_one_new_job_at_once_leave_one_owner(db: Database) -> None:
    store = RolloutStore(db=db, wall_clock=Clock().wall)
    tenants = [Tenant(owner=f"{i:012x}") for i in range(1, 9)]
    results = await asyncio.gather(
        *(
            store.pin(JobPin("job-1", V1.id, ("a",), arm=f"arm-{i}"), rollout_id="", tenant=tenant)
            for i, tenant in enumerate(tenants)
        ),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, JobPin)]
    assert len(won) == 1 and all(isinstance(r, PermissionDenied) for r in results if r not in won)
    assert await store.pin_owner("job-1") == tenants[results.index(won[0])].owner
