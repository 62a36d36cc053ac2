"""Rollouts ↔ admin API messages: the policy a rollout is created with, its gates, plan, state and history.

Split from ``messages.py`` by concept; the same rule holds: the rollout services below never see an
``admin_pb2`` message. Non-goals: validation of a request (``validation.py``), error mapping.
"""

from __future__ import annotations

from topo_tune.config.checks import overridden
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.rollout.plan import PlanPolicy, RolloutPlan, Wave
from topo_tune.controller.rollout.state import Rollout, Snapshot
from topo_tune.controller.rollout.store import AuditRecord, GateRecord
from topo_tune.errors import ValidationError
from topo_tune.v1 import admin_pb2
from topo_tune.wire.values import timestamp

_GATE_FIELDS = ("repeats", "min_bytes", "max_bytes", "step_factor", "iters", "warmup_iters")


def from_proto_policy(request: admin_pb2.CreateRolloutRequest, *, gate_defaults: RolloutGateConfig) -> PlanPolicy:
    canary = 0 if request.no_canary else (request.canary_nodes or (0 if request.canary_rack else 1))
    return PlanPolicy(
        canary_nodes=canary,
        canary_rack=request.canary_rack,
        max_parallel_racks=request.max_parallel_racks or 1,
        pause_between_s=request.pause_between_s,
        require_approval=request.require_approval,
        gate=overridden(gate_defaults, _gate_overrides(request.gate), where="gate", error=ValidationError),
    )


def _gate_overrides(gate: admin_pb2.GateMeasurement) -> dict[str, int | bool]:
    """What the request sets: a number where it is non-zero (0: the default), ``cuda_graph`` where present."""
    given: dict[str, int | bool] = {name: getattr(gate, name) for name in _GATE_FIELDS if getattr(gate, name)}
    if gate.HasField("cuda_graph"):
        given["cuda_graph"] = gate.cuda_graph
    return given


def to_proto_gate(gate: RolloutGateConfig) -> admin_pb2.GateMeasurement:
    return admin_pb2.GateMeasurement(**{name: getattr(gate, name) for name in _GATE_FIELDS}, cuda_graph=gate.cuda_graph)


def to_proto_rollout(snapshot: Snapshot, gates: list[GateRecord]) -> admin_pb2.RolloutInfo:
    rollout = snapshot.rollout
    plan = RolloutPlan(tuple(Wave(w.index, w.kind, w.racks, w.nodes, w.group) for w in snapshot.waves))
    info = to_proto_rollout_summary(rollout)
    info.MergeFrom(
        admin_pb2.RolloutInfo(
            waves=[
                admin_pb2.RolloutWave(
                    index=w.index, kind=w.kind.value, racks=list(w.racks), nodes=list(w.nodes), phase=w.phase.value
                )
                for w in snapshot.waves
            ],
            gates=[
                admin_pb2.GateResult(
                    wave=g.wave,
                    attempt=g.attempt,
                    outcome=g.verdict.outcome.value,
                    reasons=list(g.verdict.reasons),
                    time_change=g.verdict.time_change,
                    p_gain=g.verdict.p_gain,
                    p99_change=g.verdict.p99_change,
                    cv_new=g.verdict.cv_new,
                    pairs=g.verdict.pairs,
                    measured_at=timestamp(g.measured_at),
                    busbw_gbps=g.verdict.busbw_new,
                    reference_busbw_gbps=g.verdict.reference_busbw,
                    busbw_drop=g.verdict.busbw_drop,
                )
                for g in gates
            ],
            plan=plan.render(),
            node_phases={name: n.phase.value for name, n in snapshot.nodes.items()},
            gate=to_proto_gate(rollout.policy.gate),
            thresholds=rollout.thresholds.model_dump(),
        )
    )
    return info


def to_proto_rollout_summary(rollout: Rollout) -> admin_pb2.RolloutInfo:
    """A rollout's identity and phase, without waves and gates (``admin rollout list``)."""
    info = admin_pb2.RolloutInfo(
        id=rollout.id,
        config_version=rollout.config_version,
        previous_version=rollout.previous_version,
        phase=rollout.phase.value,
        wave=rollout.wave,
        reason=rollout.reason,
        created_by=rollout.created_by,
    )
    if rollout.resume_at is not None:
        info.resume_at.CopyFrom(timestamp(rollout.resume_at))
    return info


def to_proto_rollout_plan(
    version_id: str, plan: RolloutPlan, policy: PlanPolicy, thresholds: RolloutThresholdsConfig
) -> admin_pb2.RolloutInfo:
    """What a dry run would do: the waves planned, nothing stored."""
    return admin_pb2.RolloutInfo(
        config_version=version_id,
        phase="planned",
        plan=plan.render(),
        dry_run=True,
        gate=to_proto_gate(policy.gate),
        thresholds=thresholds.model_dump(),
        waves=[
            admin_pb2.RolloutWave(index=w.index, kind=w.kind.value, racks=list(w.racks), nodes=list(w.nodes))
            for w in plan.waves
        ],
    )


def to_proto_rollout_history(records: list[AuditRecord]) -> admin_pb2.RolloutHistory:
    return admin_pb2.RolloutHistory(
        transitions=[
            admin_pb2.RolloutTransition(
                at=timestamp(r.at), subject=r.subject, before=r.before, after=r.after, actor=r.actor, message=r.message
            )
            for r in records
        ]
    )
