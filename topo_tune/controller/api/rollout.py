"""The rollout and job-config RPCs of the admin service: requests → engine and resolver, results → messages.

A mixin of ``AdminServicer``: it only translates (validation of the request, proto ↔ domain through
``messages.py``, domain errors ↔ status codes through ``maps_errors``); the logic lives in
``rollout/engine.py``, ``state.py`` and ``job_pins.py``.
After a change it asks the engine for a reconcile pass at once, so operators do not wait for the next tick.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc.aio

from topo_tune.config.checks import overridden
from topo_tune.controller import names
from topo_tune.controller.api import messages, rollout_messages, validation
from topo_tune.controller.api.status_codes import maps_errors
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.rollout.engine import RolloutEngine
from topo_tune.controller.rollout.gates import check_reachable
from topo_tune.controller.rollout.job_pins import JobResolver
from topo_tune.controller.rollout.state import NodePhase, Snapshot
from topo_tune.controller.tenancy import ADMIN, Tenant, tenant_of
from topo_tune.errors import NotFoundError, ValidationError
from topo_tune.ids import ConfigVersionId
from topo_tune.jobs.config import MAX_JOB_NODES
from topo_tune.kube.job_nodes import DEFAULT_WAIT_S as DEFAULT_SCHEDULE_WAIT_S
from topo_tune.v1 import admin_pb2
from topo_tune.versions.version import ConfigVersion

logger = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]


def _actor(value: str) -> str:
    return names.short_text(value, "actor", limit=253) or "admin"


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("reconcile after an admin change failed (the next tick retries): %s", task.exception())


class RolloutServicerMixin:
    """Implements the rollout RPCs of ``AdminService``; the servicer sets ``_rollouts`` and ``_job_configs``."""

    _rollouts: RolloutEngine
    _job_configs: JobResolver
    _credentials: Credentials | None

    def _tenant(self, context: Ctx) -> Tenant:
        """Whom a job call acts for: its job credential (``tenancy``), else the admin."""
        if self._credentials is None:
            return ADMIN
        return tenant_of(self._credentials.of_metadata(context.invocation_metadata()))

    def _reconcile_soon(self) -> None:
        task = asyncio.get_running_loop().create_task(self._rollouts.reconcile())
        task.add_done_callback(_log_failure)

    async def _info(self, snapshot: Snapshot) -> admin_pb2.RolloutInfo:
        info = rollout_messages.to_proto_rollout(snapshot, await self._rollouts.store.gates(snapshot.rollout.id))
        # Why a node still moving has not moved yet: its last ApplyConfig's failure (e.g. its config disk is full).
        moving = {n for n, node in snapshot.nodes.items() if node.phase in (NodePhase.APPLYING, NodePhase.ROLLING_BACK)}
        if moving:
            failures = await self._rollouts.commands.apply_failures()
            info.node_errors.update({n: why for n, why in failures.items() if n in moving})
        return info

    @maps_errors
    async def CreateRollout(self, request: admin_pb2.CreateRolloutRequest, context: Ctx) -> admin_pb2.RolloutInfo:
        rollout_id = names.rollout_id(request.rollout_id) if request.rollout_id else None
        policy = rollout_messages.from_proto_policy(request, gate_defaults=self._rollouts.gate_defaults)
        if policy.gate.cuda_graph:
            # Refused now rather than as an inconclusive gate after the canary was already switched.
            other = [n for n in await self._rollouts.registry.list() if not n.backend.runs_nccl]
            if other:
                raise ValidationError(
                    "gate.cuda_graph",
                    f"CUDA graphs need the nccl backend; node {other[0].name} runs {other[0].backend}"
                    + (f" (and {len(other) - 1} more)" if len(other) > 1 else ""),
                )
        thresholds = overridden(
            self._rollouts.threshold_defaults, dict(request.thresholds), where="thresholds", error=ValidationError
        )
        check_reachable(policy.gate, thresholds)  # else every gate is inconclusive: refused before anything runs
        if request.files:
            version = ConfigVersion(dict(request.files), {"source": "admin"})
            if request.config_version and request.config_version != version.id:
                raise ValidationError("config_version", f"is not the hash of the files given ({version.id})")
        elif request.config_version:
            files = await self._rollouts.store.versions.files(ConfigVersionId(request.config_version))
            version = ConfigVersion(files)
        else:
            raise ValidationError("config_version", "give a known version id or the version's files")
        if request.dry_run:
            plan = await self._rollouts.plan(policy)
            return rollout_messages.to_proto_rollout_plan(version.id, plan, policy, thresholds)
        snapshot = await self._rollouts.create(
            version, policy=policy, thresholds=thresholds, actor=_actor(request.actor), rollout_id=rollout_id
        )
        self._reconcile_soon()
        return await self._info(snapshot)

    @maps_errors
    async def GetRollout(self, request: admin_pb2.GetRolloutRequest, context: Ctx) -> admin_pb2.RolloutInfo:
        store = self._rollouts.store
        if request.rollout_id:
            return await self._info(await store.load(names.rollout_id(request.rollout_id)))
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
        limit = validation.limit(request.limit, default=50, most=1000)
        rollouts = await self._rollouts.store.recent(limit=limit)
        return admin_pb2.ListRolloutsResponse(rollouts=[rollout_messages.to_proto_rollout_summary(r) for r in rollouts])

    @maps_errors
    async def ChangeRollout(self, request: admin_pb2.ChangeRolloutRequest, context: Ctx) -> admin_pb2.RolloutInfo:
        rid = names.rollout_id(request.rollout_id)
        reason = names.short_text(request.reason, "reason")
        actor = _actor(request.actor)
        engine = self._rollouts
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
        records = await self._rollouts.store.history(names.rollout_id(request.rollout_id))
        return rollout_messages.to_proto_rollout_history(records)

    @maps_errors
    async def ResolveJobConfig(self, request: admin_pb2.ResolveJobConfigRequest, context: Ctx) -> admin_pb2.JobConfig:
        job_id = names.job_id(request.job_id, required=False)
        if not job_id and not request.preview:
            raise ValidationError("job_id", "required (or ask for a preview)")
        arm = names.short_text(request.arm, "arm", limit=32)
        nodes = list(request.nodes)
        if not nodes and job_id and not request.preview:
            wait_s = float(request.schedule_wait_s or DEFAULT_SCHEDULE_WAIT_S)
            nodes = await self._job_configs.nodes_of(job_id, arm=arm, wait_s=wait_s)
        if not nodes:
            raise ValidationError("nodes", "a job needs at least one node")
        if len(nodes) > MAX_JOB_NODES:
            raise ValidationError("nodes", f"more than {MAX_JOB_NODES}")
        for index, node in enumerate(nodes):
            names.node_name(node, f"nodes[{index}]")
        resolved = await self._job_configs.resolve(
            job_id, nodes, arm=arm, preview=request.preview, tenant=self._tenant(context), may_learn=request.may_learn
        )
        return messages.to_proto_job_config(resolved, preview=request.preview)
