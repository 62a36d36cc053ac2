"""Rollouts on the admin API's wire, both ways: a request and an operator's action go out, a rollout and its
history come back, as the domain types of ``rollout_record``; and their plain form (``-o json``).

The admin client converts with these at its edge; a round trip through the wire gives the same value back
(``tests/test_rollouts_wire.py``). Non-goals: what the controller builds a rollout's message from (its own
state, ``controller/api/rollout_messages.py``), validating a request (the controller's), gRPC.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

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
from topo_tune.wire.plain_data import to_data
from topo_tune.wire.values import timestamp, timestamp_or_none

ROLLOUT_ACTION_TO_WIRE: dict[RolloutAction, admin_pb2.RolloutAction.ValueType] = {
    RolloutAction.PAUSE: admin_pb2.ROLLOUT_ACTION_PAUSE,
    RolloutAction.RESUME: admin_pb2.ROLLOUT_ACTION_RESUME,
    RolloutAction.PROMOTE: admin_pb2.ROLLOUT_ACTION_PROMOTE,
    RolloutAction.ABORT: admin_pb2.ROLLOUT_ACTION_ABORT,
    RolloutAction.ROLLBACK: admin_pb2.ROLLOUT_ACTION_ROLLBACK,
}
ROLLOUT_ACTION_FROM_WIRE = {wire: action for action, wire in ROLLOUT_ACTION_TO_WIRE.items()}


def gate_measurement_to_proto(gate: GateMeasurement) -> admin_pb2.GateMeasurement:
    return admin_pb2.GateMeasurement(
        repeats=gate.repeats,
        min_bytes=gate.min_bytes,
        max_bytes=gate.max_bytes,
        step_factor=gate.step_factor,
        iters=gate.iters,
        warmup_iters=gate.warmup_iters,
        cuda_graph=gate.cuda_graph,  # None: unset
    )


def gate_measurement_from_proto(gate: admin_pb2.GateMeasurement) -> GateMeasurement:
    return GateMeasurement(
        repeats=gate.repeats,
        min_bytes=gate.min_bytes,
        max_bytes=gate.max_bytes,
        step_factor=gate.step_factor,
        iters=gate.iters,
        warmup_iters=gate.warmup_iters,
        cuda_graph=gate.cuda_graph if gate.HasField("cuda_graph") else None,
    )


def rollout_request_to_proto(request: RolloutRequest) -> admin_pb2.CreateRolloutRequest:
    return admin_pb2.CreateRolloutRequest(
        config_version=request.config_version,
        files=dict(request.files),
        canary_nodes=request.canary_nodes,
        canary_rack=request.canary_rack,
        no_canary=request.no_canary,
        max_parallel_racks=request.max_parallel_racks,
        pause_between_s=request.pause_between_s,
        require_approval=request.require_approval,
        thresholds=dict(request.thresholds),
        gate=gate_measurement_to_proto(request.gate),
        rollout_id=request.rollout_id,
        actor=request.actor,
        dry_run=request.dry_run,
    )


def rollout_wave_to_proto(wave: RolloutWave) -> admin_pb2.RolloutWave:
    return admin_pb2.RolloutWave(
        index=wave.index, kind=wave.kind, racks=list(wave.racks), nodes=list(wave.nodes), phase=wave.phase
    )


def gate_result_to_proto(gate: GateResult) -> admin_pb2.GateResult:
    return admin_pb2.GateResult(
        wave=gate.wave,
        attempt=gate.attempt,
        outcome=gate.outcome,
        reasons=list(gate.reasons),
        time_change=gate.time_change,
        p_gain=gate.p_gain,
        p99_change=gate.p99_change,
        cv_new=gate.cv_new,
        pairs=gate.pairs,
        measured_at=timestamp_or_none(gate.measured_at),
        busbw_gbps=gate.busbw_gbps,
        reference_busbw_gbps=gate.reference_busbw_gbps,
        busbw_drop=gate.busbw_drop,
    )


def rollout_info_to_proto(info: RolloutInfo) -> admin_pb2.RolloutInfo:
    return admin_pb2.RolloutInfo(
        id=info.id,
        config_version=info.config_version,
        previous_version=info.previous_version,
        phase=info.phase,
        wave=info.wave,
        reason=info.reason,
        created_by=info.created_by,
        waves=[rollout_wave_to_proto(w) for w in info.waves],
        gates=[gate_result_to_proto(g) for g in info.gates],
        plan=info.plan,
        node_phases=dict(info.node_phases),
        dry_run=info.dry_run,
        gate=None if info.gate is None else gate_measurement_to_proto(info.gate),
        thresholds=dict(info.thresholds),
        resume_at=timestamp_or_none(info.resume_at),
        node_errors=dict(info.node_errors),
    )


def rollout_info_from_proto(info: admin_pb2.RolloutInfo) -> RolloutInfo:
    return RolloutInfo(
        id=RolloutId(info.id),
        config_version=ConfigVersionId(info.config_version),
        previous_version=ConfigVersionId(info.previous_version),
        phase=info.phase,
        wave=info.wave,
        reason=info.reason,
        created_by=info.created_by,
        waves=tuple(
            RolloutWave(index=w.index, kind=w.kind, racks=tuple(w.racks), nodes=tuple(w.nodes), phase=w.phase)
            for w in info.waves
        ),
        gates=tuple(_gate_result_from_proto(g) for g in info.gates),
        plan=info.plan,
        node_phases=dict(info.node_phases),
        dry_run=info.dry_run,
        gate=gate_measurement_from_proto(info.gate) if info.HasField("gate") else None,
        thresholds=dict(info.thresholds),
        resume_at=info.resume_at.ToDatetime(tzinfo=UTC) if info.HasField("resume_at") else None,
        node_errors=dict(info.node_errors),
    )


def _gate_result_from_proto(gate: admin_pb2.GateResult) -> GateResult:
    return GateResult(
        wave=gate.wave,
        attempt=gate.attempt,
        outcome=gate.outcome,
        reasons=tuple(gate.reasons),
        time_change=gate.time_change,
        p_gain=gate.p_gain,
        p99_change=gate.p99_change,
        cv_new=gate.cv_new,
        pairs=gate.pairs,
        measured_at=gate.measured_at.ToDatetime(tzinfo=UTC) if gate.HasField("measured_at") else None,
        busbw_gbps=gate.busbw_gbps,
        reference_busbw_gbps=gate.reference_busbw_gbps,
        busbw_drop=gate.busbw_drop,
    )


def rollout_transition_to_proto(transition: RolloutTransition) -> admin_pb2.RolloutTransition:
    return admin_pb2.RolloutTransition(
        at=timestamp(transition.at),
        subject=transition.subject,
        before=transition.before,
        after=transition.after,
        actor=transition.actor,
        message=transition.message,
    )


def rollout_transition_from_proto(transition: admin_pb2.RolloutTransition) -> RolloutTransition:
    return RolloutTransition(
        at=transition.at.ToDatetime(tzinfo=UTC),
        subject=transition.subject,
        before=transition.before,
        after=transition.after,
        actor=transition.actor,
        message=transition.message,
    )


def rollout_data(info: RolloutInfo) -> dict[str, Any]:
    """The rollout as ``-o json`` prints it: its message's plain form (``plain_data.py``)."""
    return to_data(rollout_info_to_proto(info))


def rollout_transition_data(transition: RolloutTransition) -> dict[str, Any]:
    """A history entry as ``-o json`` prints it: its message's plain form."""
    return to_data(rollout_transition_to_proto(transition))
