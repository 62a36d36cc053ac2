"""A rollout, its history and the requests about it survive the admin API's wire both ways (``wire/rollouts.py``):
what the controller sends is what the CLI reads and prints, ``-o json`` included, every field and every verb."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from topo_tune.ids import ConfigVersionId, RolloutId
from topo_tune.rollout_record import (
    GateMeasurement,
    GateResult,
    RolloutAction,
    RolloutInfo,
    RolloutRequest,
    RolloutTransition,
    RolloutWave,
)
from topo_tune.v1 import admin_pb2
from topo_tune.wire import rollouts as wire
from topo_tune.wire.plain_data import to_data
from topo_tune.wire.values import timestamp

AT = datetime(2026, 12, 3, 9, 30, 15, 250_000, tzinfo=UTC)


def _full() -> admin_pb2.RolloutInfo:
    """A rollout as ``GetRollout`` answers mid-way: every field set, ``cuda_graph`` set to False."""
    return admin_pb2.RolloutInfo(
        id="ro-1",
        config_version="cv-new",
        previous_version="cv-old",
        phase="paused",
        wave=1,
        reason="waiting for approval",
        created_by="alice@host",
        waves=[
            admin_pb2.RolloutWave(index=0, kind="canary", racks=[], nodes=["r1n1"], phase="completed"),
            admin_pb2.RolloutWave(index=1, kind="racks", racks=["r2", "r3"], nodes=["r2n1", "r3n1"], phase="applying"),
        ],
        gates=[
            admin_pb2.GateResult(
                wave=0,
                attempt=2,
                outcome="successful",
                reasons=["gain 4.1%", "p99 ok"],
                time_change=-0.041,
                p_gain=0.0031,
                p99_change=0.002,
                cv_new=0.03,
                pairs=7,
                measured_at=timestamp(AT),
                busbw_gbps=181.5,
                reference_busbw_gbps=180.25,
                busbw_drop=-0.007,
            )
        ],
        plan="WAVE KIND\n0    canary",
        node_phases={"r1n1": "applied", "r2n1": "applying"},
        dry_run=False,
        gate=admin_pb2.GateMeasurement(
            repeats=7, min_bytes=1 << 20, max_bytes=1 << 30, step_factor=4, iters=20, warmup_iters=5, cuda_graph=False
        ),
        thresholds={"min_gain": 0.02, "alpha": 0.01},
        resume_at=timestamp(AT),
        node_errors={"r2n1": "config disk full"},
    )


def test_a_rollout_comes_back_as_sent_and_prints_the_same_json() -> None:
    sent = _full()
    read = wire.rollout_info_from_proto(sent)
    assert read.gate == GateMeasurement(7, 1 << 20, 1 << 30, 4, 20, 5, cuda_graph=False), "False, not unset"
    assert read.gates[0].measured_at == AT and read.resume_at == AT and read.waves[1].racks == ("r2", "r3")
    assert wire.rollout_info_to_proto(read) == sent
    assert wire.rollout_data(read) == to_data(sent)
    assert wire.rollout_info_from_proto(wire.rollout_info_to_proto(read)) == read


def test_a_listed_rollout_has_no_gate_and_no_resume_time_and_says_null_for_both() -> None:
    summary = admin_pb2.RolloutInfo(id="ro-2", config_version="cv-a", phase="paused", created_by="bob")
    read = wire.rollout_info_from_proto(summary)
    assert read.gate is None and read.resume_at is None and read.waits_for_operator
    assert wire.rollout_info_to_proto(read) == summary
    data = wire.rollout_data(read)
    assert data == to_data(summary) and data["gate"] is None and data["resume_at"] is None


def test_a_timed_pause_does_not_wait_for_an_operator_and_only_the_final_phases_end_a_rollout() -> None:
    timed = wire.rollout_info_from_proto(_full())
    assert timed.phase == "paused" and not timed.waits_for_operator and not timed.ended
    for phase, ended in [("completed", True), ("rolled_back", True), ("aborted", True), ("rolling_back", False)]:
        assert RolloutInfo(id=RolloutId("ro"), config_version=ConfigVersionId("cv"), phase=phase).ended is ended


def test_a_domain_rollout_survives_the_wire() -> None:
    info = RolloutInfo(
        id=RolloutId("ro-3"),
        config_version=ConfigVersionId("cv-b"),
        phase="planned",
        dry_run=True,
        plan="2 waves",
        waves=(RolloutWave(0, "canary", (), ("n1",)), RolloutWave(1, "racks", ("r1",), ("n2", "n3"))),
        gates=(GateResult(0, 1, "inconclusive", ("too noisy",), measured_at=None),),
        gate=GateMeasurement(repeats=9, cuda_graph=None),
        thresholds={"max_cv": 0.1},
    )
    assert wire.rollout_info_from_proto(wire.rollout_info_to_proto(info)) == info


def test_a_request_leaves_what_it_does_not_set_to_the_controller() -> None:
    asked = RolloutRequest(
        files={"nccl.conf": "NCCL_ALGO=Ring\n"},
        canary_rack="r1",
        pause_between_s=90.0,
        thresholds={"min_gain": 0.05},
        gate=GateMeasurement(repeats=11),
        rollout_id=RolloutId("ro-4"),
        actor="alice@host",
        dry_run=True,
    )
    sent = wire.rollout_request_to_proto(asked)
    assert sent.gate.repeats == 11 and sent.gate.iters == 0, "0: cluster.yaml's rollout.gate"
    assert not sent.gate.HasField("cuda_graph"), "unset: the controller's default, graphs or not"
    assert sent.canary_nodes == 0 and not sent.no_canary and sent.canary_rack == "r1"
    assert dict(sent.files) == {"nccl.conf": "NCCL_ALGO=Ring\n"} and dict(sent.thresholds) == {"min_gain": 0.05}
    assert (sent.rollout_id, sent.actor, sent.dry_run, sent.pause_between_s) == ("ro-4", "alice@host", True, 90.0)
    eager = wire.rollout_request_to_proto(RolloutRequest(gate=GateMeasurement(cuda_graph=False)))
    assert eager.gate.HasField("cuda_graph") and not eager.gate.cuda_graph, "eager is asked for, not defaulted"


@pytest.mark.parametrize("action", list(RolloutAction))
def test_every_verb_has_its_own_wire_value_and_reads_back(action: RolloutAction) -> None:
    sent = wire.ROLLOUT_ACTION_TO_WIRE[action]
    assert wire.ROLLOUT_ACTION_FROM_WIRE[sent] is action
    assert admin_pb2.RolloutAction.Name(sent) == f"ROLLOUT_ACTION_{action.name}"


def test_the_wire_has_no_verb_without_its_action() -> None:
    assert set(wire.ROLLOUT_ACTION_FROM_WIRE) == set(admin_pb2.RolloutAction.values()) - {
        admin_pb2.ROLLOUT_ACTION_UNSPECIFIED
    }


def test_a_history_entry_comes_back_as_sent() -> None:
    sent = admin_pb2.RolloutTransition(
        at=timestamp(AT), subject="wave 1", before="applying", after="verifying", actor="engine", message="applied"
    )
    read = wire.rollout_transition_from_proto(sent)
    assert read == RolloutTransition(AT, "wave 1", "applying", "verifying", "engine", "applied")
    assert wire.rollout_transition_to_proto(read) == sent
    assert wire.rollout_transition_data(read) == to_data(sent)
