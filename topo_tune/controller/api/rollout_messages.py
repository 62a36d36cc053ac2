"""Rollouts ↔ admin API messages: the policy a rollout is created with, its gates, plan, state and history.

Split from ``messages.py`` by concept; the same rule holds: the rollout services below never see an
``admin_pb2`` message. The controller's own state becomes the admin API's view of a rollout
(``rollout_record``), which ``wire/rollouts.py`` puts on the wire as the admin client reads it back.
Non-goals: validation of a request (``validation.py``), error mapping.
"""

from __future__ import annotations

import dataclasses

from topo_tune.config.checks import overridden
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.rollout.plan import PlanPolicy, RolloutPlan, Wave
from topo_tune.controller.rollout.state import Rollout, Snapshot
from topo_tune.controller.rollout.store import AuditRecord, GateRecord
from topo_tune.errors import ValidationError
from topo_tune.ids import NO_ROLLOUT, ConfigVersionId
from topo_tune.rollout_record import GateMeasurement, GateResult, RolloutInfo, RolloutWave
from topo_tune.v1 import admin_pb2
from topo_tune.wire.rollouts import (
    gate_measurement_from_proto,
    gate_measurement_to_proto,
    rollout_info_to_proto,
    rollout_transition_to_proto,
)

_GATE_FIELDS = ("repeats", "min_bytes", "max_bytes", "step_factor", "iters", "warmup_iters")


def from_proto_policy(request: admin_pb2.CreateRolloutRequest, *, gate_defaults: RolloutGateConfig) -> PlanPolicy:
    canary = 0 if request.no_canary else (request.canary_nodes or (0 if request.canary_rack else 1))
    given = gate_measurement_from_proto(request.gate).overrides()
    return PlanPolicy(
        canary_nodes=canary,
        canary_rack=request.canary_rack,
        max_parallel_racks=request.max_parallel_racks or 1,
        pause_between_s=request.pause_between_s,
        require_approval=request.require_approval,
        gate=overridden(gate_defaults, given, where="gate", error=ValidationError),
    )


def _measurement(gate: RolloutGateConfig) -> GateMeasurement:
    return GateMeasurement(**{name: getattr(gate, name) for name in _GATE_FIELDS}, cuda_graph=gate.cuda_graph)


def to_proto_gate(gate: RolloutGateConfig) -> admin_pb2.GateMeasurement:
    return gate_measurement_to_proto(_measurement(gate))


def to_proto_rollout(snapshot: Snapshot, gates: list[GateRecord]) -> admin_pb2.RolloutInfo:
    rollout = snapshot.rollout
    plan = RolloutPlan(tuple(Wave(w.index, w.kind, w.racks, w.nodes, w.group) for w in snapshot.waves))
    info = dataclasses.replace(
        _summary(rollout),
        waves=tuple(RolloutWave(w.index, w.kind.value, w.racks, w.nodes, w.phase.value) for w in snapshot.waves),
        gates=tuple(_gate_result(g) for g in gates),
        plan=plan.render(),
        node_phases={name: n.phase.value for name, n in snapshot.nodes.items()},
        gate=_measurement(rollout.policy.gate),
        thresholds=rollout.thresholds.model_dump(),
    )
    return rollout_info_to_proto(info)


def _gate_result(gate: GateRecord) -> GateResult:
    verdict = gate.verdict
    return GateResult(
        wave=gate.wave,
        attempt=gate.attempt,
        outcome=verdict.outcome.value,
        reasons=verdict.reasons,
        time_change=verdict.time_change,
        p_gain=verdict.p_gain,
        p99_change=verdict.p99_change,
        cv_new=verdict.cv_new,
        pairs=verdict.pairs,
        measured_at=gate.measured_at,
        busbw_gbps=verdict.busbw_new,
        reference_busbw_gbps=verdict.reference_busbw,
        busbw_drop=verdict.busbw_drop,
    )


def to_proto_rollout_summary(rollout: Rollout) -> admin_pb2.RolloutInfo:
    """A rollout's identity and phase, without waves and gates (``admin rollout list``)."""
    return rollout_info_to_proto(_summary(rollout))


def _summary(rollout: Rollout) -> RolloutInfo:
    return RolloutInfo(
        id=rollout.id,
        config_version=rollout.config_version,
        previous_version=rollout.previous_version,
        phase=rollout.phase.value,
        wave=rollout.wave,
        reason=rollout.reason,
        created_by=rollout.created_by,
        resume_at=rollout.resume_at,
    )


def to_proto_rollout_plan(
    version_id: ConfigVersionId, plan: RolloutPlan, policy: PlanPolicy, thresholds: RolloutThresholdsConfig
) -> admin_pb2.RolloutInfo:
    """What a dry run would do: the waves planned, nothing stored."""
    planned = RolloutInfo(
        id=NO_ROLLOUT,
        config_version=version_id,
        phase="planned",
        plan=plan.render(),
        dry_run=True,
        gate=_measurement(policy.gate),
        thresholds=thresholds.model_dump(),
        waves=tuple(RolloutWave(w.index, w.kind.value, w.racks, w.nodes) for w in plan.waves),
    )
    return rollout_info_to_proto(planned)


def to_proto_rollout_history(records: list[AuditRecord]) -> admin_pb2.RolloutHistory:
    return admin_pb2.RolloutHistory(transitions=[rollout_transition_to_proto(r) for r in records])
