"""The admin-facing servicer: requests → registry, command book and services, domain records → messages.

The rollout and job-config RPCs come from ``rollout.py`` (a mixin); the messages are built in ``messages.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import grpc.aio

from topo_tune.controller import names
from topo_tune.controller.api import validation
from topo_tune.controller.api.learning import LearningServicerMixin
from topo_tune.controller.api.messages import (
    from_proto_command_body,
    from_proto_job_comparison,
    to_proto_cluster_topology,
    to_proto_command,
    to_proto_config_version,
    to_proto_node,
)
from topo_tune.controller.api.pages import PAGE_BYTES, from_page_token, to_page_token
from topo_tune.controller.api.rollout import RolloutServicerMixin
from topo_tune.controller.api.status_codes import maps_errors
from topo_tune.controller.api.watch import WatchServicerMixin
from topo_tune.controller.commands import CommandBook
from topo_tune.controller.config_versions import ConfigVersions
from topo_tune.controller.credential_ledger import CredentialLedger, IssuedRecord
from topo_tune.controller.credentials import Credentials, Role, credential_id
from topo_tune.controller.job_comparisons import JobComparisons
from topo_tune.controller.job_timings import JobTimings
from topo_tune.wire.drift_checks import drift_check_to_proto
from topo_tune.wire.job_comparisons import job_comparison_to_proto
from topo_tune.wire.studies import from_proto_study_request, to_proto_study, to_proto_study_trials
from topo_tune.wire.values import timestamp, timestamp_or_none

if TYPE_CHECKING:
    from topo_tune.controller.api.in_process import InProcessPort
    from topo_tune.controller.drift import DriftChecker
    from topo_tune.controller.studies import Studies
from topo_tune.controller.benchmarks.service import BenchmarkJobs
from topo_tune.controller.nodes import NodeRegistry
from topo_tune.controller.probes import Probes
from topo_tune.controller.rollout.engine import RolloutEngine
from topo_tune.controller.rollout.job_pins import JobResolver
from topo_tune.controller.sessions import SessionHub
from topo_tune.errors import ConflictError, TopoTuneError, ValidationError
from topo_tune.ids import ConfigVersionId, NodeName
from topo_tune.v1 import admin_pb2, admin_pb2_grpc
from topo_tune.wire.admin_jobs import (
    benchmark_job_to_proto,
    benchmark_request_from_proto,
    pair_to_proto,
    probe_request_from_proto,
    probe_round_to_proto,
)

logger = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
"""The admin service's full name, as health checks and reflection know it."""


class AdminServicer(
    WatchServicerMixin, LearningServicerMixin, RolloutServicerMixin, admin_pb2_grpc.AdminServiceServicer
):
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
        studies: Studies[InProcessPort] | None = None,
        drift: DriftChecker | None = None,
        credentials: Credentials | None = None,
        job_comparisons: JobComparisons | None = None,
        credential_ledger: CredentialLedger | None = None,
        job_timings: JobTimings | None = None,
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
        self._job_comparisons = job_comparisons
        self._ledger = credential_ledger
        self._job_timings = job_timings

    @maps_errors
    async def ListNodes(self, request: admin_pb2.ListNodesRequest, context: Ctx) -> admin_pb2.ListNodesResponse:
        if request.rack:
            names.node_name(request.rack, "rack")
        views = await self._registry.list(rack=request.rack)
        listed = [to_proto_node(v, with_topology=False) for v in views]
        failures = await self._commands.apply_failures()
        for node in listed:
            node.config_apply_error = failures.get(node.name, "")
        return admin_pb2.ListNodesResponse(nodes=listed)

    @maps_errors
    async def GetNode(self, request: admin_pb2.GetNodeRequest, context: Ctx) -> admin_pb2.Node:
        name = names.node_name(request.name, "name")
        node = to_proto_node(await self._registry.get(name), with_topology=True)
        node.config_apply_error = (await self._commands.apply_failures(request.name)).get(request.name, "")
        return node

    @maps_errors
    async def SendCommand(self, request: admin_pb2.SendCommandRequest, context: Ctx) -> admin_pb2.CommandInfo:
        validation.send_command(request)  # the node name included
        command = from_proto_command_body(request)
        record = await self._commands.submit(NodeName(request.node_name), command, command_id=request.command_id)
        if not record.status.final and record.deliveries == 0:
            await self._hub.deliver_new(record)
            record = await self._commands.get(record.id)
        return to_proto_command(record)

    @maps_errors
    async def SendCommands(
        self, request: admin_pb2.SendCommandsRequest, context: Ctx
    ) -> admin_pb2.SendCommandsResponse:
        validation.send_commands(request)
        command = from_proto_command_body(request)
        nodes = list(request.node_names) or [view.name for view in await self._registry.list()]
        prefix = request.command_id_prefix
        if prefix:
            # The ids stay within the command-id limit with every node name appended.
            for name in nodes:
                names.command_id(f"{prefix}-{name}", "command_id_prefix")
        records = await self._commands.submit_many(nodes, command, command_id_prefix=prefix)
        await self._hub.deliver_many(records)
        now = await self._commands.get_many([r.id for r in records])
        return admin_pb2.SendCommandsResponse(commands=[to_proto_command(r) for r in now])

    @maps_errors
    async def GetCommand(self, request: admin_pb2.GetCommandRequest, context: Ctx) -> admin_pb2.CommandInfo:
        names.command_id(request.command_id, "command_id")
        return to_proto_command(await self._commands.get(request.command_id))

    @maps_errors
    async def ListCommands(
        self, request: admin_pb2.ListCommandsRequest, context: Ctx
    ) -> admin_pb2.ListCommandsResponse:
        if request.node_name:
            names.node_name(request.node_name, "node_name")
        limit = validation.limit(request.limit, default=100)
        records = await self._commands.list(node_name=request.node_name, limit=limit)
        return admin_pb2.ListCommandsResponse(commands=[to_proto_command(r) for r in records])

    @maps_errors
    async def GetClusterTopology(
        self, request: admin_pb2.GetClusterTopologyRequest, context: Ctx
    ) -> admin_pb2.ClusterTopologyView:
        return to_proto_cluster_topology(await self._registry.list(), self._spine)

    @maps_errors
    async def StartBenchmark(self, request: admin_pb2.StartBenchmarkRequest, context: Ctx) -> admin_pb2.BenchmarkJob:
        return benchmark_job_to_proto(await self._jobs.start(benchmark_request_from_proto(request)))

    @maps_errors
    async def GetBenchmark(self, request: admin_pb2.GetBenchmarkRequest, context: Ctx) -> admin_pb2.BenchmarkJob:
        names.command_id(request.job_id, "job_id")
        return benchmark_job_to_proto(await self._jobs.get(request.job_id))

    @maps_errors
    async def ListBenchmarks(
        self, request: admin_pb2.ListBenchmarksRequest, context: Ctx
    ) -> admin_pb2.ListBenchmarksResponse:
        jobs = await self._jobs.list(limit=validation.limit(request.limit, default=50))
        return admin_pb2.ListBenchmarksResponse(jobs=[benchmark_job_to_proto(job) for job in jobs])

    @maps_errors
    async def StartProbeRound(self, request: admin_pb2.StartProbeRoundRequest, context: Ctx) -> admin_pb2.ProbeRound:
        return probe_round_to_proto(await self._probes.start(probe_request_from_proto(request)))

    @maps_errors
    async def GetProbeRound(self, request: admin_pb2.GetProbeRoundRequest, context: Ctx) -> admin_pb2.ProbeRound:
        names.command_id(request.round_id, "round_id")
        return probe_round_to_proto(await self._probes.get(request.round_id))

    @maps_errors
    async def GetMeasuredPairs(
        self, request: admin_pb2.GetMeasuredPairsRequest, context: Ctx
    ) -> admin_pb2.MeasuredPairs:
        return admin_pb2.MeasuredPairs(pairs=[pair_to_proto(p) for p in await self._probes.measured_pairs()])

    @maps_errors
    async def PutConfigVersion(
        self, request: admin_pb2.PutConfigVersionRequest, context: Ctx
    ) -> admin_pb2.ConfigVersionInfo:
        names.labels(request.provenance, "provenance")
        stored = await self._config_versions.put(request.files, request.provenance, claimed_id=request.id)
        return to_proto_config_version(stored)

    @maps_errors
    async def GetConfigVersion(
        self, request: admin_pb2.GetConfigVersionRequest, context: Ctx
    ) -> admin_pb2.ConfigVersionInfo:
        return to_proto_config_version(await self._config_versions.get(ConfigVersionId(request.id)))

    @maps_errors
    async def ListConfigVersions(
        self, request: admin_pb2.ListConfigVersionsRequest, context: Ctx
    ) -> admin_pb2.ListConfigVersionsResponse:
        return admin_pb2.ListConfigVersionsResponse(
            versions=[
                to_proto_config_version(v)
                for v in await self._config_versions.list(limit=validation.limit(request.limit, default=50))
            ]
        )

    def _study_runner(self) -> Studies[InProcessPort]:
        if self._studies is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller runs no studies")
        return self._studies

    @maps_errors
    async def StartStudy(self, request: admin_pb2.StartStudyRequest, context: Ctx) -> admin_pb2.StudyInfo:
        return to_proto_study(await self._study_runner().start(from_proto_study_request(request)))

    @maps_errors
    async def GetStudy(self, request: admin_pb2.GetStudyRequest, context: Ctx) -> admin_pb2.StudyInfo:
        names.study_id(request.study_id)
        return to_proto_study(await self._study_runner().get(request.study_id))

    @maps_errors
    async def ListStudies(self, request: admin_pb2.ListStudiesRequest, context: Ctx) -> admin_pb2.ListStudiesResponse:
        studies = await self._study_runner().list(limit=validation.limit(request.limit, default=50))
        return admin_pb2.ListStudiesResponse(studies=[to_proto_study(study) for study in studies])

    @maps_errors
    async def ListStudyTrials(self, request: admin_pb2.GetStudyRequest, context: Ctx) -> admin_pb2.StudyTrials:
        names.study_id(request.study_id)
        return to_proto_study_trials(await self._study_runner().trials(request.study_id))

    @maps_errors
    async def CancelStudy(self, request: admin_pb2.GetStudyRequest, context: Ctx) -> admin_pb2.StudyInfo:
        names.study_id(request.study_id)
        return to_proto_study(await self._study_runner().cancel(request.study_id))

    def _drift_checks(self) -> DriftChecker:
        if self._drift is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller runs no drift checks")
        return self._drift

    @maps_errors
    async def ListDriftChecks(
        self, request: admin_pb2.ListDriftChecksRequest, context: Ctx
    ) -> admin_pb2.ListDriftChecksResponse:
        checks = await self._drift_checks().list(
            limit=validation.limit(request.limit, default=50), status=request.status
        )
        return admin_pb2.ListDriftChecksResponse(checks=[drift_check_to_proto(check) for check in checks])

    @maps_errors
    async def GetDriftCheck(self, request: admin_pb2.GetDriftCheckRequest, context: Ctx) -> admin_pb2.DriftCheck:
        names.command_id(request.check_id, "check_id")
        return drift_check_to_proto(await self._drift_checks().get(request.check_id))

    @maps_errors
    async def RunDriftCheck(self, request: admin_pb2.RunDriftCheckRequest, context: Ctx) -> admin_pb2.DriftCheck:
        names.short_text(request.config_version, "config_version")
        return drift_check_to_proto(await self._drift_checks().start(version=request.config_version))

    @maps_errors
    async def IssueCredential(
        self, request: admin_pb2.IssueCredentialRequest, context: Ctx
    ) -> admin_pb2.IssuedCredential:
        if self._credentials is None:
            raise TopoTuneError("this controller issues no credentials")
        if request.role == admin_pb2.CREDENTIAL_ROLE_AGENT:
            role = Role.AGENT
            names.node_name(request.node_name, "node_name")
            if request.scope:
                raise ValidationError("scope", "an agent credential is bound to its node; leave it empty")
        elif request.role == admin_pb2.CREDENTIAL_ROLE_JOB:
            if request.node_name:
                raise ValidationError("node_name", "a job credential is not bound to a node; leave it empty")
            role = Role.JOB
            if request.scope:
                names.job_id(request.scope, "scope")
        else:
            raise ValidationError("role", "credentials are issued for the agent or the job role only")
        if self._ledger is not None:
            token, record = await self._ledger.issue(role, request.node_name, scope=request.scope)
            key = record.id
        else:
            token = (
                self._credentials.issue_agent(request.node_name)
                if role is Role.AGENT
                else self._credentials.issue_job(request.scope)
            )
            key = credential_id(token)
        logger.info("issued %s credential %s", role.value, key, extra={"node": request.node_name})
        return admin_pb2.IssuedCredential(
            token=token, role=request.role, node_name=request.node_name, id=key, scope=request.scope
        )

    def _credential_ledger(self) -> CredentialLedger:
        if self._ledger is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller keeps no credential ledger")
        return self._ledger

    @maps_errors
    async def ListCredentials(
        self, request: admin_pb2.ListCredentialsRequest, context: Ctx
    ) -> admin_pb2.ListCredentialsResponse:
        records = await self._credential_ledger().list()
        return admin_pb2.ListCredentialsResponse(credentials=[_credential_info(r) for r in records])

    @maps_errors
    async def RevokeCredential(
        self, request: admin_pb2.RevokeCredentialRequest, context: Ctx
    ) -> admin_pb2.CredentialInfo:
        return _credential_info(await self._credential_ledger().revoke(request.id))

    def _comparisons(self) -> JobComparisons:
        if self._job_comparisons is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller keeps no job comparisons")
        return self._job_comparisons

    @maps_errors
    async def RecordJobComparison(
        self, request: admin_pb2.RecordJobComparisonRequest, context: Ctx
    ) -> admin_pb2.JobComparison:
        header, runs = from_proto_job_comparison(request)
        recorded = await self._comparisons().record(header, runs, tenant=self._tenant(context))
        return job_comparison_to_proto(recorded)

    @maps_errors
    async def ListJobComparisons(
        self, request: admin_pb2.ListJobComparisonsRequest, context: Ctx
    ) -> admin_pb2.ListJobComparisonsResponse:
        job_id = names.job_id(request.job_id, required=False)
        after = from_page_token(request.page_token)
        limit = validation.limit(request.limit, default=50)
        found = await self._comparisons().list(job_id=job_id, limit=limit, after=after)
        reply = admin_pb2.ListJobComparisonsResponse()
        for index, comparison in enumerate(found):
            message = job_comparison_to_proto(comparison)
            if reply.comparisons and reply.ByteSize() + message.ByteSize() > PAGE_BYTES:
                reply.next_page_token = to_page_token(found[index - 1])
                break
            reply.comparisons.append(message)
        else:
            if len(found) == limit:
                reply.next_page_token = to_page_token(found[-1])
        return reply


_ROLES = {Role.AGENT: admin_pb2.CREDENTIAL_ROLE_AGENT, Role.JOB: admin_pb2.CREDENTIAL_ROLE_JOB}


def _credential_info(record: IssuedRecord) -> admin_pb2.CredentialInfo:
    return admin_pb2.CredentialInfo(
        id=record.id,
        role=_ROLES[record.role],
        node_name=record.node_name,
        scope=record.scope,
        issued_at=timestamp(record.issued_at),
        revoked_at=timestamp_or_none(record.revoked_at),
    )
