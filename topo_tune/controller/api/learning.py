"""The learning RPCs of the admin service (``docs/learning.md``): a version's kill switch, the timing records
learning jobs ship, the evidence they give and a challenger proposed as a new version.

A mixin of ``AdminServicer``: it only translates; the logic lives in ``config_versions.py`` and
``job_timings.py``. Whom a job call acts for comes from the rollout mixin (``_tenant``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc.aio

from topo_tune.controller import names
from topo_tune.controller.api.messages import to_proto_config_version
from topo_tune.controller.api.status_codes import maps_errors
from topo_tune.controller.config_versions import ConfigVersions
from topo_tune.controller.job_timings import JobTimings
from topo_tune.controller.learning import Learning
from topo_tune.controller.tenancy import Tenant
from topo_tune.ids import ConfigVersionId
from topo_tune.learning.version_evidence import VersionEvidence
from topo_tune.v1 import admin_pb2

Ctx = grpc.aio.ServicerContext[Any, Any]


class LearningServicerMixin:
    """Implements the learning RPCs of ``AdminService``; the servicer sets ``_config_versions`` and
    ``_job_timings``."""

    _config_versions: ConfigVersions
    _job_timings: JobTimings | None

    _tenant: Callable[[Ctx], Tenant]
    """Whom a job call acts for (the rollout mixin's)."""

    def _timings(self) -> JobTimings:
        if self._job_timings is None:  # pragma: no cover - the server always wires it
            raise RuntimeError("no job timings wired")
        return self._job_timings

    def _learning(self) -> Learning:
        return Learning(self._config_versions, self._timings())

    @maps_errors
    async def SetVersionLearning(
        self, request: admin_pb2.SetVersionLearningRequest, context: Ctx
    ) -> admin_pb2.ConfigVersionInfo:
        actor = names.short_text(request.actor, "actor", limit=253) or "admin"
        stored = await self._config_versions.set_learning(
            ConfigVersionId(request.id), stopped=request.stopped, actor=actor
        )
        return to_proto_config_version(stored)

    @maps_errors
    async def GetLearningEvidence(
        self, request: admin_pb2.GetLearningEvidenceRequest, context: Ctx
    ) -> admin_pb2.LearningEvidence:
        return to_proto_evidence(await self._learning().evidence(ConfigVersionId(request.id)))

    @maps_errors
    async def ProposeLearnedVersion(
        self, request: admin_pb2.ProposeLearnedVersionRequest, context: Ctx
    ) -> admin_pb2.ConfigVersionInfo:
        actor = names.short_text(request.actor, "actor", limit=253) or "admin"
        stored = await self._learning().propose(ConfigVersionId(request.id), request.arm, actor=actor)
        return to_proto_config_version(stored)

    @maps_errors
    async def RecordJobTiming(
        self, request: admin_pb2.RecordJobTimingRequest, context: Ctx
    ) -> admin_pb2.RecordJobTimingReply:
        job_id = names.job_id(request.job_id)
        node = names.node_name(request.node, "node")
        stored = await self._timings().record(job_id, node, list(request.records), tenant=self._tenant(context))
        return admin_pb2.RecordJobTimingReply(stored=stored)


def to_proto_evidence(evidence: VersionEvidence) -> admin_pb2.LearningEvidence:
    return admin_pb2.LearningEvidence(
        id=evidence.version,
        jobs_by_arm=dict(evidence.jobs_by_arm),
        divergent=list(evidence.divergent),
        cells=[
            admin_pb2.LearningCell(
                arm=c.arm,
                collective=c.collective,
                class_bytes=c.class_bytes,
                speedup=c.speedup,
                ci_low=c.ci_low,
                ci_high=c.ci_high,
                jobs=c.jobs,
                decision=c.decision,
                applies=c.applies,
            )
            for c in evidence.cells
        ],
        proposable=list(evidence.proposable),
        learning_stopped=evidence.learning_stopped,
        learning_stopped_why=evidence.learning_stopped_why,
    )
