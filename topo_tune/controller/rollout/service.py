"""The rollout and job-config RPCs of the admin service: requests → engine and resolver, results → messages.

A mixin of ``AdminServicer``: it only translates (validation of the request, proto ↔ domain, domain errors
↔ status codes through ``maps_errors``); the logic lives in ``engine.py``, ``state.py`` and ``job_pins.py``.
After a change it asks the engine for a reconcile pass at once, so operators do not wait for the next tick.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import grpc.aio
from google.protobuf.timestamp_pb2 import Timestamp

from topo_tune.cluster_config import RolloutGateConfig
from topo_tune.config_checks import overridden
from topo_tune.config_version import ConfigVersion
from topo_tune.controller import validation
from topo_tune.controller.rollout.engine import RolloutEngine
from topo_tune.controller.rollout.job_pins import JobResolver
from topo_tune.controller.rollout.plan import Plan, PlanPolicy, Wave, build_plan
from topo_tune.controller.rollout.state import Snapshot
from topo_tune.controller.rollout.store import GateRecord
from topo_tune.controller.status_codes import maps_errors
from topo_tune.errors import NotFoundError, ValidationError
from topo_tune.v1 import admin_pb2

logger = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]
MAX_JOB_NODES = 100_000


def _ts(at: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp


def _actor(value: str) -> str:
    return validation.short_text(value, "actor", limit=253) or "admin"


_GATE_FIELDS = ("repeats", "min_bytes", "max_bytes", "step_factor", "iters", "warmup_iters")


def policy_from(request: admin_pb2.CreateRolloutRequest, *, gate_defaults: RolloutGateConfig) -> PlanPolicy:
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


def gate_message(gate: RolloutGateConfig) -> admin_pb2.GateMeasurement:
    return admin_pb2.GateMeasurement(**{name: getattr(gate, name) for name in _GATE_FIELDS}, cuda_graph=gate.cuda_graph)


def rollout_message(snapshot: Snapshot, gates: list[GateRecord]) -> admin_pb2.RolloutInfo:
    rollout = snapshot.rollout
    plan = Plan(tuple(Wave(w.index, w.kind, w.racks, w.nodes) for w in snapshot.waves))
    return admin_pb2.RolloutInfo(
        id=rollout.id,
        config_version=rollout.config_version,
        previous_version=rollout.previous_version,
        phase=rollout.phase.value,
        wave=rollout.wave,
        reason=rollout.reason,
        created_by=rollout.created_by,
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
                measured_at=_ts(g.measured_at),
                busbw_gbps=g.verdict.busbw_new,
                reference_busbw_gbps=g.verdict.reference_busbw,
                busbw_drop=g.verdict.busbw_drop,
            )
            for g in gates
        ],
        plan=plan.render(),
        node_phases={name: n.phase.value for name, n in snapshot.nodes.items()},
        gate=gate_message(rollout.policy.gate),
        thresholds=rollout.thresholds.model_dump(),
    )


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("reconcile after an admin change failed (the next tick retries): %s", task.exception())


class RolloutServicerMixin:
    """Implements the rollout RPCs of ``AdminService``; the servicer sets ``_rollouts`` and ``_job_configs``."""

    _rollouts: RolloutEngine
    _job_configs: JobResolver

    def _reconcile_soon(self) -> None:
        task = asyncio.get_running_loop().create_task(self._rollouts.reconcile())
        task.add_done_callback(_log_failure)

    async def _info(self, snapshot: Snapshot) -> admin_pb2.RolloutInfo:
        return rollout_message(snapshot, await self._rollouts.store.gates(snapshot.rollout.id))

    @maps_errors
    async def CreateRollout(self, request: admin_pb2.CreateRolloutRequest, context: Ctx) -> admin_pb2.RolloutInfo:
        if request.rollout_id:
            validation.command_id(request.rollout_id, "rollout_id")
        policy = policy_from(request, gate_defaults=self._rollouts.gate_defaults)
        if policy.gate.cuda_graph:
            # Refused now rather than as an inconclusive gate after the canary was already switched.
            other = [n for n in await self._rollouts.registry.list() if n.backend != "nccl"]
            if other:
                raise ValidationError(
                    "gate.cuda_graph",
                    f"CUDA graphs need the nccl backend; node {other[0].name} runs {other[0].backend}"
                    + (f" (and {len(other) - 1} more)" if len(other) > 1 else ""),
                )
        thresholds = overridden(
            self._rollouts.threshold_defaults, dict(request.thresholds), where="thresholds", error=ValidationError
        )
        if request.files:
            version = ConfigVersion(dict(request.files), {"source": "admin"})
            if request.config_version and request.config_version != version.id:
                raise ValidationError("config_version", f"is not the hash of the files given ({version.id})")
        elif request.config_version:
            files = await self._rollouts.store.versions.files(request.config_version)
            version = ConfigVersion(files)
        else:
            raise ValidationError("config_version", "give a known version id or the version's files")
        if request.dry_run:
            nodes = await self._rollouts.registry.list()
            plan = build_plan({n.name: n.rack for n in nodes}, policy)
            return admin_pb2.RolloutInfo(
                config_version=version.id,
                phase="planned",
                plan=plan.render(),
                dry_run=True,
                gate=gate_message(policy.gate),
                thresholds=thresholds.model_dump(),
                waves=[
                    admin_pb2.RolloutWave(index=w.index, kind=w.kind.value, racks=list(w.racks), nodes=list(w.nodes))
                    for w in plan.waves
                ],
            )
        snapshot = await self._rollouts.create(
            version, policy=policy, thresholds=thresholds, actor=_actor(request.actor), rollout_id=request.rollout_id
        )
        self._reconcile_soon()
        return await self._info(snapshot)

    @maps_errors
    async def GetRollout(self, request: admin_pb2.GetRolloutRequest, context: Ctx) -> admin_pb2.RolloutInfo:
        store = self._rollouts.store
        if request.rollout_id:
            validation.command_id(request.rollout_id, "rollout_id")
            return await self._info(await store.load(request.rollout_id))
        snapshot = await store.active()
        if snapshot is None:
            recent = await store.recent(limit=1)
            if not recent:
                raise NotFoundError("no rollout yet")
            snapshot = await store.load(recent[0].id)
        return await self._info(snapshot)

    @maps_errors
    async def ListRollouts(
        self, request: admin_pb2.ListRolloutsRequest, context: Ctx
    ) -> admin_pb2.ListRolloutsResponse:
        limit = request.limit or 50
        if limit > 1000:
            raise ValidationError("limit", "at most 1000")
        rollouts = await self._rollouts.store.recent(limit=limit)
        return admin_pb2.ListRolloutsResponse(
            rollouts=[
                admin_pb2.RolloutInfo(
                    id=r.id,
                    config_version=r.config_version,
                    previous_version=r.previous_version,
                    phase=r.phase.value,
                    wave=r.wave,
                    reason=r.reason,
                    created_by=r.created_by,
                )
                for r in rollouts
            ]
        )

    @maps_errors
    async def ChangeRollout(self, request: admin_pb2.ChangeRolloutRequest, context: Ctx) -> admin_pb2.RolloutInfo:
        validation.command_id(request.rollout_id, "rollout_id")
        reason = validation.short_text(request.reason, "reason")
        actor = _actor(request.actor)
        engine, rid = self._rollouts, request.rollout_id
        action = request.action
        if action == admin_pb2.ROLLOUT_ACTION_PAUSE:
            snapshot = await engine.pause(rid, actor=actor, reason=reason)
        elif action == admin_pb2.ROLLOUT_ACTION_RESUME:
            snapshot = await engine.resume(rid, actor=actor)
        elif action == admin_pb2.ROLLOUT_ACTION_PROMOTE:
            snapshot = await engine.promote(rid, actor=actor)
        elif action == admin_pb2.ROLLOUT_ACTION_ABORT:
            snapshot = await engine.abort(rid, actor=actor, reason=reason)
        elif action == admin_pb2.ROLLOUT_ACTION_ROLLBACK:
            snapshot = await engine.rollback(rid, actor=actor, reason=reason)
        else:
            raise ValidationError("action", "one of pause, resume, promote, abort, rollback")
        self._reconcile_soon()
        return await self._info(snapshot)

    @maps_errors
    async def GetRolloutHistory(
        self, request: admin_pb2.GetRolloutHistoryRequest, context: Ctx
    ) -> admin_pb2.RolloutHistory:
        validation.command_id(request.rollout_id, "rollout_id")
        records = await self._rollouts.store.history(request.rollout_id)
        return admin_pb2.RolloutHistory(
            transitions=[
                admin_pb2.RolloutTransition(
                    at=_ts(r.at), subject=r.subject, before=r.before, after=r.after, actor=r.actor, message=r.message
                )
                for r in records
            ]
        )

    @maps_errors
    async def ResolveJobConfig(self, request: admin_pb2.ResolveJobConfigRequest, context: Ctx) -> admin_pb2.JobConfig:
        job_id = validation.short_text(request.job_id, "job_id", limit=253)
        if not job_id:
            raise ValidationError("job_id", "required")
        if not request.nodes:
            raise ValidationError("nodes", "a job needs at least one node")
        if len(request.nodes) > MAX_JOB_NODES:
            raise ValidationError("nodes", f"more than {MAX_JOB_NODES}")
        for index, node in enumerate(request.nodes):
            validation.node_name(node, f"nodes[{index}]")
        resolved = await self._job_configs.resolve(job_id, list(request.nodes))
        return admin_pb2.JobConfig(
            job_id=resolved.pin.job_id,
            config_version=resolved.pin.version,
            files=list(resolved.files),
            nodes=list(resolved.pin.nodes),
            rollout_id=resolved.rollout_id,
        )
