"""The admin-facing servicer: requests → registry and command book, domain records → messages.

The rollout and job-config RPCs come from ``rollout/service.py`` (a mixin), next to the logic they front.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

import grpc.aio
from google.protobuf.timestamp_pb2 import Timestamp

from topo_tune.controller import validation
from topo_tune.controller.commands import STATUS_TO_WIRE, CommandBook, CommandRecord
from topo_tune.controller.config_versions import ConfigVersions
from topo_tune.controller.credentials import Credentials

if TYPE_CHECKING:
    from topo_tune.controller.drift import DriftChecker
    from topo_tune.controller.studies import Studies
from topo_tune.controller.jobs import BenchmarkJobs
from topo_tune.controller.nodes import NodeRegistry, NodeState, NodeView
from topo_tune.controller.probes import Probes
from topo_tune.controller.rollout.engine import RolloutEngine
from topo_tune.controller.rollout.job_pins import JobResolver
from topo_tune.controller.rollout.service import RolloutServicerMixin
from topo_tune.controller.sessions import SessionHub
from topo_tune.controller.status_codes import maps_errors
from topo_tune.errors import ConflictError, TopoTuneError, ValidationError
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, topology_pb2

logger = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]

NODE_STATES = {NodeState.READY: admin_pb2.NODE_STATE_READY, NodeState.LOST: admin_pb2.NODE_STATE_LOST}
ACTIVITIES = {
    "idle": agent_pb2.AGENT_ACTIVITY_IDLE,
    "busy": agent_pb2.AGENT_ACTIVITY_BUSY,
    "drained": agent_pb2.AGENT_ACTIVITY_DRAINED,
}
BACKENDS = {"nccl": agent_pb2.BACKEND_NCCL, "gloo": agent_pb2.BACKEND_GLOO, "sim": agent_pb2.BACKEND_SIM}


def _ts(at: datetime | None) -> Timestamp | None:
    if at is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp


def node_message(view: NodeView, *, with_topology: bool) -> admin_pb2.Node:
    node = admin_pb2.Node(
        name=view.name,
        rack=view.rack,
        state=NODE_STATES[view.state],
        labels=dict(view.labels),
        registered_at=_ts(view.registered_at),
        last_heartbeat_at=_ts(view.last_heartbeat_at),
        agent_version=view.agent_version,
        backend=BACKENDS.get(view.backend, agent_pb2.BACKEND_UNSPECIFIED),
        drained=view.drained,
        activity=ACTIVITIES.get(view.activity, agent_pb2.AGENT_ACTIVITY_UNSPECIFIED),
        applied_config_version=view.applied_config_version,
        registrations=view.registrations,
        address=view.address,
        config_damage=view.config_damage,
    )
    if with_topology and view.topology:
        node.topology.CopyFrom(topology_pb2.NodeTopology.FromString(view.topology))
    return node


def cluster_topology_view(
    views: list[NodeView], spine: tuple[float | None, float | None]
) -> admin_pb2.ClusterTopologyView:
    """Every node with its topology, and the spine from cluster.yaml: what ``admin topology`` renders."""
    view = admin_pb2.ClusterTopologyView(nodes=[node_message(v, with_topology=True) for v in views])
    oversubscription, bandwidth = spine
    if oversubscription is not None:
        view.spine_oversubscription = oversubscription
    if bandwidth is not None:
        view.spine_bandwidth_gbps = bandwidth
    return view


def command_message(record: CommandRecord) -> admin_pb2.CommandInfo:
    info = admin_pb2.CommandInfo(
        command_id=record.id,
        node_name=record.node_name,
        kind=record.kind,
        status=STATUS_TO_WIRE[record.status],
        message=record.message,
        created_at=_ts(record.created_at),
        finished_at=_ts(record.finished_at),
        deliveries=record.deliveries,
    )
    if record.result is not None:
        info.result.CopyFrom(record.result)
    return info


def _command_body(request: admin_pb2.SendCommandRequest | admin_pb2.SendCommandsRequest) -> agent_pb2.Command:
    command = agent_pb2.Command()
    kind = request.WhichOneof("body")
    if kind == "rediscover":
        command.rediscover.CopyFrom(request.rediscover)
    elif kind == "drain":
        command.drain.CopyFrom(request.drain)
    else:  # pragma: no cover - validation refuses it
        raise ValidationError("body", f"unsupported command {kind!r}")
    return command


class AdminServicer(RolloutServicerMixin, admin_pb2_grpc.AdminServiceServicer):
    def __init__(
        self,
        *,
        registry: NodeRegistry,
        commands: CommandBook,
        hub: SessionHub,
        jobs: BenchmarkJobs,
        probes: Probes,
        spine_oversubscription: float | None = None,
        spine_bandwidth_gbps: float | None = None,
        rollouts: RolloutEngine,
        job_configs: JobResolver,
        config_versions: ConfigVersions,
        studies: Studies | None = None,
        drift: DriftChecker | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._registry = registry
        self._commands = commands
        self._hub = hub
        self._jobs = jobs
        self._probes = probes
        self._spine = (spine_oversubscription, spine_bandwidth_gbps)
        self._rollouts = rollouts
        self._job_configs = job_configs
        self._config_versions = config_versions
        self._studies = studies
        self._drift = drift
        self._credentials = credentials

    @maps_errors
    async def ListNodes(self, request: admin_pb2.ListNodesRequest, context: Ctx) -> admin_pb2.ListNodesResponse:
        if request.rack:
            validation.node_name(request.rack, "rack")
        views = await self._registry.list(rack=request.rack)
        return admin_pb2.ListNodesResponse(nodes=[node_message(v, with_topology=False) for v in views])

    @maps_errors
    async def GetNode(self, request: admin_pb2.GetNodeRequest, context: Ctx) -> admin_pb2.Node:
        validation.node_name(request.name, "name")
        return node_message(await self._registry.get(request.name), with_topology=True)

    @maps_errors
    async def SendCommand(self, request: admin_pb2.SendCommandRequest, context: Ctx) -> admin_pb2.CommandInfo:
        validation.send_command(request)
        command = _command_body(request)
        record = await self._commands.submit(request.node_name, command, command_id=request.command_id)
        if not record.status.final and record.deliveries == 0:
            await self._hub.deliver_new(record)
            record = await self._commands.get(record.id)
        return command_message(record)

    @maps_errors
    async def SendCommands(
        self, request: admin_pb2.SendCommandsRequest, context: Ctx
    ) -> admin_pb2.SendCommandsResponse:
        validation.send_commands(request)
        command = _command_body(request)
        nodes = list(request.node_names) or [view.name for view in await self._registry.list()]
        prefix = request.command_id_prefix
        if prefix:
            # The ids stay within the command-id limit with every node name appended.
            for name in nodes:
                validation.command_id(f"{prefix}-{name}", "command_id_prefix")
        records = await self._commands.submit_many(nodes, command, command_id_prefix=prefix)
        await self._hub.deliver_many(records)
        now = await self._commands.get_many([r.id for r in records])
        return admin_pb2.SendCommandsResponse(commands=[command_message(r) for r in now])

    @maps_errors
    async def GetCommand(self, request: admin_pb2.GetCommandRequest, context: Ctx) -> admin_pb2.CommandInfo:
        validation.command_id(request.command_id, "command_id")
        return command_message(await self._commands.get(request.command_id))

    @maps_errors
    async def ListCommands(
        self, request: admin_pb2.ListCommandsRequest, context: Ctx
    ) -> admin_pb2.ListCommandsResponse:
        if request.node_name:
            validation.node_name(request.node_name, "node_name")
        limit = request.limit or 100
        if limit > 10_000:
            raise ValidationError("limit", "at most 10000")
        records = await self._commands.list(node_name=request.node_name, limit=limit)
        return admin_pb2.ListCommandsResponse(commands=[command_message(r) for r in records])

    @maps_errors
    async def GetClusterTopology(
        self, request: admin_pb2.GetClusterTopologyRequest, context: Ctx
    ) -> admin_pb2.ClusterTopologyView:
        return cluster_topology_view(await self._registry.list(), self._spine)

    @maps_errors
    async def StartBenchmark(self, request: admin_pb2.StartBenchmarkRequest, context: Ctx) -> admin_pb2.BenchmarkJob:
        return await self._jobs.start(request)

    @maps_errors
    async def GetBenchmark(self, request: admin_pb2.GetBenchmarkRequest, context: Ctx) -> admin_pb2.BenchmarkJob:
        validation.command_id(request.job_id, "job_id")
        return await self._jobs.get(request.job_id)

    @maps_errors
    async def ListBenchmarks(
        self, request: admin_pb2.ListBenchmarksRequest, context: Ctx
    ) -> admin_pb2.ListBenchmarksResponse:
        if request.limit > 10_000:
            raise ValidationError("limit", "at most 10000")
        return admin_pb2.ListBenchmarksResponse(jobs=await self._jobs.list(limit=request.limit or 50))

    @maps_errors
    async def StartProbeRound(self, request: admin_pb2.StartProbeRoundRequest, context: Ctx) -> admin_pb2.ProbeRound:
        return await self._probes.start(request)

    @maps_errors
    async def GetProbeRound(self, request: admin_pb2.GetProbeRoundRequest, context: Ctx) -> admin_pb2.ProbeRound:
        validation.command_id(request.round_id, "round_id")
        return await self._probes.get(request.round_id)

    @maps_errors
    async def GetMeasuredPairs(
        self, request: admin_pb2.GetMeasuredPairsRequest, context: Ctx
    ) -> admin_pb2.MeasuredPairs:
        return await self._probes.measured_pairs()

    @maps_errors
    async def PutConfigVersion(
        self, request: admin_pb2.PutConfigVersionRequest, context: Ctx
    ) -> admin_pb2.ConfigVersionInfo:
        validation.labels(request.provenance, "provenance")
        return await self._config_versions.put(request.files, request.provenance, claimed_id=request.id)

    @maps_errors
    async def GetConfigVersion(
        self, request: admin_pb2.GetConfigVersionRequest, context: Ctx
    ) -> admin_pb2.ConfigVersionInfo:
        return await self._config_versions.get(request.id)

    @maps_errors
    async def ListConfigVersions(
        self, request: admin_pb2.ListConfigVersionsRequest, context: Ctx
    ) -> admin_pb2.ListConfigVersionsResponse:
        if request.limit > 10_000:
            raise ValidationError("limit", "at most 10000")
        return admin_pb2.ListConfigVersionsResponse(
            versions=await self._config_versions.list(limit=request.limit or 50)
        )

    def _study_runner(self) -> Studies:
        if self._studies is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller runs no studies")
        return self._studies

    @maps_errors
    async def StartStudy(self, request: admin_pb2.StartStudyRequest, context: Ctx) -> admin_pb2.StudyInfo:
        return await self._study_runner().start(request)

    @maps_errors
    async def GetStudy(self, request: admin_pb2.GetStudyRequest, context: Ctx) -> admin_pb2.StudyInfo:
        validation.node_name(request.study_id, "study_id")
        return await self._study_runner().get(request.study_id)

    @maps_errors
    async def ListStudies(self, request: admin_pb2.ListStudiesRequest, context: Ctx) -> admin_pb2.ListStudiesResponse:
        if request.limit > 10_000:
            raise ValidationError("limit", "at most 10000")
        return admin_pb2.ListStudiesResponse(studies=await self._study_runner().list(limit=request.limit or 50))

    @maps_errors
    async def ListStudyTrials(self, request: admin_pb2.GetStudyRequest, context: Ctx) -> admin_pb2.StudyTrials:
        validation.node_name(request.study_id, "study_id")
        return await self._study_runner().trials(request.study_id)

    @maps_errors
    async def CancelStudy(self, request: admin_pb2.GetStudyRequest, context: Ctx) -> admin_pb2.StudyInfo:
        validation.node_name(request.study_id, "study_id")
        return await self._study_runner().cancel(request.study_id)

    def _drift_checks(self) -> DriftChecker:
        if self._drift is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller runs no drift checks")
        return self._drift

    @maps_errors
    async def ListDriftChecks(
        self, request: admin_pb2.ListDriftChecksRequest, context: Ctx
    ) -> admin_pb2.ListDriftChecksResponse:
        if request.limit > 10_000:
            raise ValidationError("limit", "at most 10000")
        checks = await self._drift_checks().list(limit=request.limit or 50, status=request.status)
        return admin_pb2.ListDriftChecksResponse(checks=checks)

    @maps_errors
    async def GetDriftCheck(self, request: admin_pb2.GetDriftCheckRequest, context: Ctx) -> admin_pb2.DriftCheck:
        validation.command_id(request.check_id, "check_id")
        return await self._drift_checks().get(request.check_id)

    @maps_errors
    async def RunDriftCheck(self, request: admin_pb2.RunDriftCheckRequest, context: Ctx) -> admin_pb2.DriftCheck:
        validation.short_text(request.config_version, "config_version")
        return await self._drift_checks().start(version=request.config_version)

    @maps_errors
    async def IssueCredential(
        self, request: admin_pb2.IssueCredentialRequest, context: Ctx
    ) -> admin_pb2.IssuedCredential:
        if self._credentials is None:
            raise TopoTuneError("this controller issues no credentials")
        if request.role == admin_pb2.CREDENTIAL_ROLE_AGENT:
            token = self._credentials.issue_agent(request.node_name)
        elif request.role == admin_pb2.CREDENTIAL_ROLE_JOB:
            if request.node_name:
                raise ValidationError("node_name", "a job credential is not bound to a node; leave it empty")
            token = self._credentials.issue_job()
        else:
            raise ValidationError("role", "credentials are issued for the agent or the job role only")
        logger.info(
            "issued a %s credential",
            admin_pb2.CredentialRole.Name(request.role).removeprefix("CREDENTIAL_ROLE_").lower(),
            extra={"node": request.node_name},
        )
        return admin_pb2.IssuedCredential(token=token, role=request.role, node_name=request.node_name)
