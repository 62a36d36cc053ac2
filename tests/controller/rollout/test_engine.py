"""The rollout engine against a simulated fleet: full rollouts, automatic rollback, operator verbs, crashes."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.controller.rollout.fleet import V1, V2, V3, Clock, ControllerParts, SimFleet, SimVerifier, racks
from topo_tune.config.cluster import RolloutThresholdsConfig
from topo_tune.controller.api.rollout_messages import to_proto_rollout
from topo_tune.controller.db.database import Database
from topo_tune.controller.rollout.engine import NoVerifier
from topo_tune.controller.rollout.gates import Outcome
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.controller.rollout.state import RolloutPhase, Snapshot, WavePhase
from topo_tune.errors import ConflictError, NotFoundError

RACKS = racks(4, 2)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def parts(sqlite_url: str, clock: Clock) -> AsyncIterator[ControllerParts]:
    started = await ControllerParts.start(sqlite_url, clock, SimVerifier(RACKS))
    yield started
    started.close()


async def drive(parts: ControllerParts, fleet: SimFleet, clock: Clock, rollout_id: str, passes: int = 100) -> Snapshot:
    """Agents act, the engine reconciles, time passes: until the rollout ends or waits for a human."""
    for _ in range(passes):
        await fleet.tick(parts.registry, parts.commands)
        await parts.engine.reconcile()
        snapshot = await parts.engine.store.load(rollout_id)
        rollout = snapshot.rollout
        if rollout.phase.final or (rollout.phase is RolloutPhase.PAUSED and rollout.resume_at is None):
            return snapshot
        clock.advance(1)
    raise AssertionError(f"rollout {rollout_id} did not settle: {snapshot.rollout}")


async def complete_v1(parts: ControllerParts, fleet: SimFleet, clock: Clock) -> None:
    await fleet.register_all(parts.registry)
    parts.engine.verifier = SimVerifier(fleet.rack_of)
    first = await parts.engine.create(V1, policy=PlanPolicy(), thresholds=RolloutThresholdsConfig(), actor="alice")
    assert (await drive(parts, fleet, clock, first.rollout.id)).rollout.phase is RolloutPhase.COMPLETED


async def test_a_full_rollout_goes_canary_then_rack_by_rack(parts: ControllerParts, clock: Clock) -> None:
    fleet = SimFleet(RACKS)
    await fleet.register_all(parts.registry)
    created = await parts.engine.create(
        V1, policy=PlanPolicy(canary_nodes=1), thresholds=RolloutThresholdsConfig(), actor="alice", rollout_id="ro-1"
    )
    assert [w.racks for w in created.waves] == [("rack-1",), ("rack-1",), ("rack-2",), ("rack-3",), ("rack-4",)]
    final = await drive(parts, fleet, clock, "ro-1")
    assert final.rollout.phase is RolloutPhase.COMPLETED
    assert all(w.phase is WavePhase.COMPLETED for w in final.waves)
    assert fleet.active == dict.fromkeys(RACKS, V1.id), "every node reports the new version"
    assert all(applied == [V1.id] for applied in fleet.executed.values()), "each node changed exactly once"
    gates = await parts.engine.store.gates("ro-1")
    assert [(g.wave, g.verdict.outcome) for g in gates] == [(i, Outcome.SUCCESSFUL) for i in range(5)]
    assert len(gates[0].samples) == 20, "raw A/B samples are stored with the verdict"
    history = await parts.engine.store.history("ro-1")
    waves_started = [h.subject for h in history if h.after == WavePhase.APPLYING and h.subject.startswith("wave")]
    assert waves_started == [f"wave {i}" for i in range(5)], "waves in order, each once"
    assert history[0].actor == "alice"
    assert await parts.engine.store.stable_version() == V1.id


async def test_racks_are_rolled_out_spine_block_by_block_from_the_labels_nodes_register_with(
    parts: ControllerParts, clock: Clock
) -> None:
    # Topograph's labels as the agent sends them: the rack from the leaf, the block above it as a label.
    block_of = {"rack-1": "block-2", "rack-2": "block-10", "rack-3": "block-2", "rack-4": "block-10"}
    labels = {node: {"network.topology.nvidia.com/block": block_of[rack]} for node, rack in RACKS.items()}
    fleet = SimFleet(RACKS, labels=labels)
    await fleet.register_all(parts.registry)
    policy = PlanPolicy(canary_nodes=0, max_parallel_racks=2)
    created = await parts.engine.create(
        V1, policy=policy, thresholds=RolloutThresholdsConfig(), actor="alice", rollout_id="ro-1"
    )
    assert [(w.group, w.racks) for w in created.waves] == [
        (("block-2",), ("rack-1", "rack-3")),
        (("block-10",), ("rack-2", "rack-4")),
    ], "racks of one block together, blocks in natural order; rack-2 waits for block-2 to pass"
    shown = to_proto_rollout(await parts.engine.store.load("ro-1"), []).plan
    assert shown.splitlines()[1].split() == ["0", "racks", "4", "block-2", "rack-1,", "rack-3"], shown
    final = await drive(parts, fleet, clock, "ro-1")
    assert final.rollout.phase is RolloutPhase.COMPLETED


async def test_a_regressed_rack_fails_its_gate_and_every_applied_wave_rolls_back(
    parts: ControllerParts, clock: Clock
) -> None:
    fleet = SimFleet(RACKS)
    await complete_v1(parts, fleet, clock)
    parts.engine.verifier = SimVerifier(RACKS, regressed_racks=frozenset({"rack-3"}))
    rollout = await parts.engine.create(V2, policy=PlanPolicy(), thresholds=RolloutThresholdsConfig(), actor="bob")
    final = await drive(parts, fleet, clock, rollout.rollout.id)
    assert final.rollout.phase is RolloutPhase.ROLLED_BACK
    assert "wave 3 gate failed" in final.rollout.reason
    assert fleet.active == dict.fromkeys(RACKS, V1.id), "no node left on the new version"
    assert fleet.executed["r4n1"] == [V1.id], "rack-4 was never touched"
    assert fleet.executed["r1n1"] == [V1.id, V2.id, V1.id]
    history = await parts.engine.store.history(rollout.rollout.id)
    order = [h.subject for h in history if h.after == WavePhase.ROLLING_BACK and h.subject.startswith("wave")]
    assert order == ["wave 3", "wave 2", "wave 1", "wave 0"], "reverse wave order"
    assert [w.phase for w in final.waves][-1] is WavePhase.PENDING
    assert await parts.engine.store.stable_version() == V1.id


async def test_a_rack_slower_than_the_canary_rack_fails_its_gate_although_its_ab_passes(
    parts: ControllerParts, clock: Clock
) -> None:
    fleet = SimFleet(RACKS)
    await complete_v1(parts, fleet, clock)
    parts.engine.verifier = SimVerifier(RACKS, slow_racks=frozenset({"rack-3"}))
    policy = PlanPolicy(canary_rack="rack-1")
    rollout = await parts.engine.create(V2, policy=policy, thresholds=RolloutThresholdsConfig(), actor="bob")
    final = await drive(parts, fleet, clock, rollout.rollout.id)
    assert final.rollout.phase is RolloutPhase.ROLLED_BACK
    assert "wave 2 gate failed" in final.rollout.reason and "below the reference" in final.rollout.reason
    gates = await parts.engine.store.gates(rollout.rollout.id)
    canary, second, third = (g.verdict for g in gates)
    assert second.reference_busbw == canary.busbw_new and second.outcome is Outcome.SUCCESSFUL
    assert third.time_change < 0, "the A/B on rack-3 alone shows the version's gain"
    assert third.busbw_drop == pytest.approx(0.5, abs=0.05)
    assert fleet.active == dict.fromkeys(RACKS, V1.id), "no node left on the new version"


async def test_require_approval_pauses_after_each_wave_until_promoted(parts: ControllerParts, clock: Clock) -> None:
    fleet = SimFleet(racks(2, 1))
    await fleet.register_all(parts.registry)
    parts.engine.verifier = SimVerifier(fleet.rack_of)
    created = await parts.engine.create(
        V1, policy=PlanPolicy(canary_nodes=0, require_approval=True), thresholds=RolloutThresholdsConfig(), actor="a"
    )
    rid = created.rollout.id
    paused = await drive(parts, fleet, clock, rid)
    assert (paused.rollout.phase, paused.rollout.wave) == (RolloutPhase.PAUSED, 1)
    assert fleet.active == {"r1n1": V1.id}, "the next wave waits"
    with pytest.raises(NotFoundError):
        await parts.engine.promote("ro-missing", actor="carol")
    await parts.engine.promote(rid, actor="carol")
    final = await drive(parts, fleet, clock, rid)
    assert final.rollout.phase is RolloutPhase.COMPLETED
    assert any(h.actor == "carol" for h in await parts.engine.store.history(rid))
    with pytest.raises(ConflictError, match="only a paused rollout"):
        await parts.engine.promote(rid, actor="carol")


async def test_an_inconclusive_gate_pauses_and_a_resume_runs_it_again(parts: ControllerParts, clock: Clock) -> None:
    fleet = SimFleet(racks(2, 1))
    await fleet.register_all(parts.registry)
    parts.engine.verifier = NoVerifier()
    created = await parts.engine.create(
        V1, policy=PlanPolicy(canary_nodes=0), thresholds=RolloutThresholdsConfig(), actor="a"
    )
    rid = created.rollout.id
    paused = await drive(parts, fleet, clock, rid)
    assert paused.rollout.phase is RolloutPhase.PAUSED
    assert "gate inconclusive" in paused.rollout.reason
    parts.engine.verifier = SimVerifier(fleet.rack_of)
    await parts.engine.resume(rid, actor="a")
    final = await drive(parts, fleet, clock, rid)
    assert final.rollout.phase is RolloutPhase.COMPLETED
    gates = await parts.engine.store.gates(rid)
    assert [(g.wave, g.attempt, g.verdict.outcome.value) for g in gates] == [
        (0, 1, "inconclusive"),
        (0, 2, "successful"),
        (1, 1, "successful"),
    ]


async def test_a_lost_node_pauses_the_rollout_which_never_proceeds_past_it(
    parts: ControllerParts, clock: Clock
) -> None:
    fleet = SimFleet(racks(2, 2))
    await fleet.register_all(parts.registry)
    parts.engine.verifier = SimVerifier(fleet.rack_of)
    fleet.lost.add("r2n2")
    clock.advance(60)  # everyone heartbeats in tick() except the lost node
    await fleet.tick(parts.registry, parts.commands)
    assert await parts.registry.sweep() == ["r2n2"]
    created = await parts.engine.create(
        V1, policy=PlanPolicy(canary_nodes=0), thresholds=RolloutThresholdsConfig(), actor="a"
    )
    paused = await drive(parts, fleet, clock, created.rollout.id)
    assert (paused.rollout.phase, paused.rollout.wave) == (RolloutPhase.PAUSED, 1)
    assert "r2n2" in paused.rollout.reason
    assert "r2n1" not in fleet.active or fleet.active["r2n1"] == V1.id
    fleet.lost.clear()
    await parts.engine.resume(created.rollout.id, actor="a")
    final = await drive(parts, fleet, clock, created.rollout.id)
    assert final.rollout.phase is RolloutPhase.COMPLETED
    assert fleet.active["r2n2"] == V1.id


async def test_pause_between_waves_waits_on_the_clock(parts: ControllerParts, clock: Clock) -> None:
    fleet = SimFleet(racks(2, 1))
    await fleet.register_all(parts.registry)
    parts.engine.verifier = SimVerifier(fleet.rack_of)
    created = await parts.engine.create(
        V1, policy=PlanPolicy(canary_nodes=0, pause_between_s=30), thresholds=RolloutThresholdsConfig(), actor="a"
    )
    for _ in range(10):
        await fleet.tick(parts.registry, parts.commands)
        await parts.engine.reconcile()
    waiting = await parts.engine.store.load(created.rollout.id)
    assert waiting.rollout.phase is RolloutPhase.PAUSED and waiting.rollout.resume_at is not None
    assert "r2n1" not in fleet.active
    final = await drive(parts, fleet, clock, created.rollout.id)
    assert final.rollout.phase is RolloutPhase.COMPLETED
    assert any(h.actor == "timer" for h in await parts.engine.store.history(created.rollout.id))


async def test_operator_rollback_of_a_completed_rollout_is_idempotent(parts: ControllerParts, clock: Clock) -> None:
    fleet = SimFleet(racks(2, 1))
    await complete_v1(parts, fleet, clock)
    second = await parts.engine.create(
        V2, policy=PlanPolicy(canary_nodes=0), thresholds=RolloutThresholdsConfig(), actor="a"
    )
    with pytest.raises(ConflictError, match="still active"):
        await parts.engine.create(V3, policy=PlanPolicy(), thresholds=RolloutThresholdsConfig(), actor="a")
    assert (await drive(parts, fleet, clock, second.rollout.id)).rollout.phase is RolloutPhase.COMPLETED
    await parts.engine.rollback(second.rollout.id, actor="dave", reason="users complain")
    again = await parts.engine.rollback(second.rollout.id, actor="dave")
    assert again.rollout.phase is RolloutPhase.ROLLING_BACK
    final = await drive(parts, fleet, clock, second.rollout.id)
    assert (final.rollout.phase, final.rollout.reason) == (RolloutPhase.ROLLED_BACK, "users complain")
    assert set(fleet.active.values()) == {V1.id}
    assert await parts.engine.store.stable_version() == V1.id


async def settle(parts: ControllerParts, fleet: SimFleet, clock: Clock, passes: int = 10) -> None:
    for _ in range(passes):
        await fleet.tick(parts.registry, parts.commands)
        await parts.engine.reconcile()
        clock.advance(1)


async def test_abort_stops_the_rollout_and_the_fleet_returns_to_the_stable_version(
    parts: ControllerParts, clock: Clock
) -> None:
    fleet = SimFleet(racks(2, 1))
    await complete_v1(parts, fleet, clock)
    parts.engine.verifier = NoVerifier()
    created = await parts.engine.create(
        V2, policy=PlanPolicy(canary_nodes=0), thresholds=RolloutThresholdsConfig(), actor="a"
    )
    await drive(parts, fleet, clock, created.rollout.id)
    assert fleet.active["r1n1"] == V2.id, "the first wave got the new version before the gate paused"
    aborted = await parts.engine.abort(created.rollout.id, actor="erin")
    assert aborted.rollout.phase is RolloutPhase.ABORTED
    with pytest.raises(ConflictError):
        await parts.engine.resume(created.rollout.id, actor="erin")
    await settle(parts, fleet, clock)
    assert fleet.active == dict.fromkeys(fleet.rack_of, V1.id), "back on the stable version"
    assert (await parts.engine.store.load(created.rollout.id)).rollout.phase is RolloutPhase.ABORTED


async def test_a_node_that_joins_later_or_drifts_is_brought_to_the_stable_version(
    parts: ControllerParts, clock: Clock
) -> None:
    fleet = SimFleet(racks(2, 1))
    await complete_v1(parts, fleet, clock)
    late = SimFleet({"r3n1": "rack-3"}, busy={"r3n1": 1})
    await late.register_all(parts.registry)
    await settle(parts, late, clock, passes=3)
    assert "r3n1" not in late.active, "refused while busy; the retry waits"
    clock.advance(parts.engine.retry_after_s)
    await settle(parts, late, clock)
    assert late.active["r3n1"] == V1.id
    fleet.active["r1n1"] = V2.id  # someone changed the node behind the controller's back
    await settle(parts, fleet, clock)
    assert fleet.active["r1n1"] == V1.id
    assert fleet.executed["r1n1"] == [V1.id, V1.id]


async def test_a_busy_node_is_retried_after_a_delay_and_pauses_the_rollout_when_it_stays_busy(
    parts: ControllerParts, clock: Clock
) -> None:
    fleet = SimFleet(racks(2, 1), busy={"r1n1": 2, "r2n1": 99})
    await fleet.register_all(parts.registry)
    parts.engine.verifier = SimVerifier(fleet.rack_of)
    created = await parts.engine.create(
        V1, policy=PlanPolicy(canary_nodes=0), thresholds=RolloutThresholdsConfig(), actor="a"
    )
    rid = created.rollout.id
    for _ in range(5):  # no time passes: the refused command is not retried yet
        await fleet.tick(parts.registry, parts.commands)
        await parts.engine.reconcile()
    assert (await parts.engine.store.load(rid)).nodes["r1n1"].attempt == 1
    paused = await drive(parts, fleet, clock, rid, passes=400)
    assert paused.rollout.phase is RolloutPhase.PAUSED
    assert "node r2n1 refused" in paused.rollout.reason and "a job on this node" in paused.rollout.reason
    assert fleet.active["r1n1"] == V1.id, "r1n1 took it on its third attempt"
    assert paused.nodes["r1n1"].attempt == 3
    assert "r2n1" not in fleet.active, "a busy node is never changed under its job"


# -- the controller killed at every point ----------------------------------------------------------------------


class Crash(Exception):
    """Stands for SIGKILL: nothing after this point runs in the old controller."""


async def run_with_crash(
    template: Path, path: Path, crash_after: int | None
) -> tuple[Snapshot, SimFleet, list[tuple[int, int]], int]:
    """A regression rollout (rack-2 bad) on 3 racks from NCCL's defaults; the controller dies after
    ``crash_after`` DB calls and a new one resumes on the same database."""
    clock = Clock()
    rack_of = racks(3, 1)
    fleet = SimFleet(rack_of)
    verifier = SimVerifier(rack_of, regressed_racks=frozenset({"rack-2"}))
    shutil.copyfile(template, path)  # a migrated, empty database: migrating each of ~100 runs would dominate
    url = f"sqlite:///{path}"
    parts = await ControllerParts.start(url, clock, verifier, migrate=False)
    await fleet.register_all(parts.registry)
    calls = 0
    original = parts.db.run

    async def counting(work):  # type: ignore[no-untyped-def]
        nonlocal calls
        result = await original(work)
        calls += 1
        if crash_after is not None and calls == crash_after:
            raise Crash
        return result

    parts.db.run = counting  # type: ignore[method-assign]
    rollout_id = "ro-crash"
    crashed = False
    try:
        await parts.engine.create(
            V2,
            policy=PlanPolicy(canary_nodes=0),
            thresholds=RolloutThresholdsConfig(),
            actor="a",
            rollout_id=rollout_id,
        )
        await drive(parts, fleet, clock, rollout_id)
    except Crash:
        crashed = True
    parts.close()
    if crashed:
        parts = await ControllerParts.start(url, clock, verifier, migrate=False)  # a new controller, same database
        try:
            if (await parts.engine.store.recent()) == []:
                await parts.engine.create(
                    V2,
                    policy=PlanPolicy(canary_nodes=0),
                    thresholds=RolloutThresholdsConfig(),
                    actor="a",
                    rollout_id=rollout_id,
                )
            final = await drive(parts, fleet, clock, rollout_id)
        finally:
            parts.close()
    else:
        parts = await ControllerParts.start(url, clock, verifier, migrate=False)
        final = await parts.engine.store.load(rollout_id)
        parts.close()
    return final, fleet, verifier.calls, calls


async def test_a_controller_killed_at_any_point_resumes_to_the_same_end(tmp_path: Path) -> None:
    template = tmp_path / "template.db"
    made = Database(f"sqlite:///{template}")
    made.migrate()
    made.close()  # the last connection's close checkpoints the WAL into the file that is copied
    reference, ref_fleet, ref_gates, total = await run_with_crash(template, tmp_path / "ref.db", None)
    assert reference.rollout.phase is RolloutPhase.ROLLED_BACK
    assert set(ref_fleet.active.values()) == {""}, "back on NCCL's defaults"
    assert ref_fleet.executed == {"r1n1": [V2.id, ""], "r2n1": [V2.id, ""]}
    # Every second database call (each is a point where a SIGKILL leaves a different state), and the last one.
    points = sorted({*range(1, total, 2), total - 1})
    for point in points:
        final, fleet, gates, _ = await run_with_crash(template, tmp_path / f"crash-{point}.db", point)
        label = f"killed after DB call {point} of {total}"
        assert final.rollout.phase is reference.rollout.phase, label
        assert final.rollout.reason == reference.rollout.reason, label
        assert [w.phase for w in final.waves] == [w.phase for w in reference.waves], label
        assert fleet.active == ref_fleet.active, label
        assert fleet.executed == ref_fleet.executed, f"{label}: a wave was applied twice or skipped"
        assert {g for g in gates} == set(ref_gates), f"{label}: a gate was skipped"
