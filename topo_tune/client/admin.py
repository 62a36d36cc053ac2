"""A client of the admin service, for the CLI and for scripts.

Its callers get domain values, never the admin API's messages: studies, drift checks, benchmark jobs, probe rounds,
credentials, rollouts, nodes, commands, a job's config, job comparisons (``wire/`` and this package convert
them at this edge); only the config version calls still answer with messages.

Transport errors never escape this module: every ``grpc.RpcError`` becomes a ``ControllerError`` (or its
subclasses ``ControllerUnavailable`` / ``Unauthenticated``), or the domain error its status code stands for
(``NOT_FOUND`` → ``NotFoundError``, ``PERMISSION_DENIED`` → ``PermissionDenied``, ``INVALID_ARGUMENT`` →
``RequestRefused``, a ``ValidationError``; ``FAILED_PRECONDITION`` → ``ConflictError``, ``ALREADY_EXISTS`` →
``AlreadyExists``, ``ABORTED`` → ``NodeBusy``), with the controller's own message. "Cannot reach the
controller" (gRPC's own UNAVAILABLE, or a deadline with no answer) is told apart from "the controller
answered: its database is unavailable / full" (``ControllerDatabaseUnavailable`` / ``ControllerDatabaseFull``)
by the error kind the controller puts in the trailing metadata; the transport never sets it.

Waiting on a job, probe round, drift check, rollout or study follows the controller's watch stream: one call that
the controller answers at each change, so a waiting client sends nothing. A stream broken by a controller
restart (or a leader change) is watched again once the controller answers, for up to ``reconnect_s``; after
that the wait fails with one line naming what was being waited for and how to look at it later.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest
from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound
from topo_tune.client.credential_entries import (
    ROLE_TO_WIRE,
    CredentialEntry,
    IssuedRole,
    IssuedToken,
    credential_entry,
)
from topo_tune.client.job_answer import checked_job_config
from topo_tune.client.watch_step import WatchStep
from topo_tune.command_record import CommandInfo, NodeCommand
from topo_tune.drift_record import DriftCheck
from topo_tune.errors import (
    ERROR_FIELD,
    ERROR_KIND,
    AlreadyExists,
    ConflictError,
    ControllerDatabaseFull,
    ControllerDatabaseUnavailable,
    ControllerError,
    ControllerUnavailable,
    NodeBusy,
    NotFoundError,
    PermissionDenied,
    QuotaExceeded,
    RequestRefused,
    Unauthenticated,
)
from topo_tune.ids import NO_CONFIG_VERSION, NO_ROLLOUT, ConfigVersionId, JobId, NodeName, RolloutId, StudyId
from topo_tune.jobs.compare.comparison_record import ComparisonHeader, StoredComparison
from topo_tune.jobs.compare.summary import RunValue
from topo_tune.jobs.job_config import JobConfig
from topo_tune.node_record import NodeInfo, NodeInventory
from topo_tune.rollout_record import RolloutAction, RolloutInfo, RolloutRequest, RolloutTransition
from topo_tune.security.auth import TlsFiles, bearer_metadata, channel_credentials, with_default_port
from topo_tune.study_record import Study, StudyRequest, StudyTrials
from topo_tune.v1 import admin_pb2, admin_pb2_grpc
from topo_tune.wire.admin_jobs import (
    benchmark_job_from_proto,
    benchmark_request_to_proto,
    pair_from_proto,
    probe_request_to_proto,
    probe_round_from_proto,
)
from topo_tune.wire.commands import command_from_proto, send_command_to_proto, send_commands_to_proto
from topo_tune.wire.drift_checks import drift_check_from_proto
from topo_tune.wire.job_comparisons import job_comparison_from_proto, job_comparison_request_to_proto
from topo_tune.wire.job_configs import job_config_from_proto
from topo_tune.wire.nodes import node_from_proto, node_inventory_from_proto
from topo_tune.wire.rollouts import (
    ROLLOUT_ACTION_TO_WIRE,
    rollout_info_from_proto,
    rollout_request_to_proto,
    rollout_transition_from_proto,
)
from topo_tune.wire.studies import from_proto_study, from_proto_study_trials, to_proto_study_request

if TYPE_CHECKING:
    from topo_tune.learning.version_evidence import VersionEvidence

logger = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U", bound="_Update")


class _Update(Protocol):
    @property
    def progress(self) -> admin_pb2.Progress: ...


STORAGE_KINDS = frozenset({"StorageError"})


def _trailing(error: grpc.RpcError, wanted: str) -> str | None:
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == wanted:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


def _answered_kind(error: grpc.RpcError) -> str:
    """The class name of the controller's error; empty when the controller did not answer (the transport's)."""
    return _trailing(error, ERROR_KIND) or ""


def _refused_field(error: grpc.RpcError, details: str) -> RequestRefused:
    """The controller's ``INVALID_ARGUMENT`` as the ``ValidationError`` it raised: the field as it named it (a
    controller older than ``ERROR_FIELD``: the text before the first ": ")."""
    field = _trailing(error, ERROR_FIELD)
    if field is None:
        field, _, reason = details.partition(": ")
        return RequestRefused(field, reason) if reason else RequestRefused("", details)
    return RequestRefused(field, details.removeprefix(f"{field}: ") if field else details)


@contextmanager
def _mapped(address: str) -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        details: str = error.details() or code.name
        kind = _answered_kind(error)
        if kind == "DatabaseFull":
            raise ControllerDatabaseFull(f"controller {address} answered: {details}") from None
        if kind == "QuotaExceeded":  # a cap of this credential or row: nothing was stored; no retry helps
            raise QuotaExceeded(details) from None
        if kind in STORAGE_KINDS:
            raise ControllerDatabaseUnavailable(f"controller {address} answered: {details}") from None
        if code == grpc.StatusCode.UNAVAILABLE and kind:
            raise ControllerUnavailable(f"controller {address} answered that it cannot serve now: {details}") from None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise ControllerUnavailable(f"controller {address} is unreachable: no answer in time ({details})") from None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise Unauthenticated(f"controller {address} refused the token: {details}") from None
        if code == grpc.StatusCode.PERMISSION_DENIED:
            raise PermissionDenied(f"controller {address} refused: {details}") from None
        if code == grpc.StatusCode.UNAVAILABLE:
            raise ControllerUnavailable(f"controller {address} is unreachable: {details}") from None
        if code == grpc.StatusCode.NOT_FOUND:
            raise NotFoundError(details) from None
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            raise _refused_field(error, details) from None
        if code == grpc.StatusCode.ABORTED:
            raise NodeBusy(details) from None
        if code == grpc.StatusCode.ALREADY_EXISTS:
            raise AlreadyExists(details) from None
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            raise ConflictError(details) from None
        raise ControllerError(f"controller {address}: {code.name}: {details}") from None


class AdminClient:
    """Synchronous admin calls with a per-call deadline."""

    def __init__(
        self,
        address: str,
        *,
        token: str,
        tls: TlsFiles | None = None,
        timeout_s: float = 10.0,
        reconnect_s: float = 60.0,
    ) -> None:
        self.address = address = with_default_port(address)
        self._timeout_s = timeout_s
        self._reconnect_s = reconnect_s
        self._metadata = bearer_metadata(token)
        if tls is not None:
            self._channel = grpc.secure_channel(address, channel_credentials(tls))
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = admin_pb2_grpc.AdminServiceStub(self._channel)

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., T], request: object, *, longer_by_s: float = 0.0) -> T:
        with _mapped(self.address):
            timeout = self._timeout_s + longer_by_s
            return method(request, timeout=timeout, metadata=self._metadata, wait_for_ready=False)

    def _watch(
        self,
        method: Callable[..., Iterator[U]],
        key: str,
        what: str,
        ended: Callable[[U], bool],
        on_update: Callable[[U], None] | None,
        *,
        later: str,
    ) -> U:
        """The last update of ``what``'s watch stream (the ended state), watched again after a break."""
        request = admin_pb2.WatchRequest(id=key)
        broken_since: float | None = None
        pause = 0.1
        while True:
            last: U | None = None
            try:
                with _mapped(self.address):
                    stream = method(request, metadata=self._metadata)
                    for update in stream:
                        broken_since, pause, last = None, 0.1, update
                        if on_update is not None:
                            on_update(update)
                        if ended(update):  # e.g. a paused rollout: the stream would go on, the wait is over
                            if isinstance(stream, grpc.Call):
                                stream.cancel()
                            return update
                if last is not None and ended(last):
                    return last
                why = "the stream ended early"
            except ControllerUnavailable as error:
                why = str(error)
            except ControllerError as error:
                if "UNIMPLEMENTED" in str(error):
                    raise ControllerError(
                        f"controller {self.address} cannot stream {what} (an older version): {later}"
                    ) from None
                raise
            now = time.monotonic()
            if broken_since is None:
                logger.warning("lost the controller while waiting for %s (%s); watching again", what, why)
                broken_since = now
            if now - broken_since > self._reconnect_s:
                raise ControllerUnavailable(
                    f"lost the controller while waiting for {what} ({why}; no answer for {self._reconnect_s:g} s); "
                    f"it may still end: {later}"
                )
            time.sleep(pause)  # back off between attempts while the controller is away (or a standby answers)
            pause = min(pause * 2, 2.0)
            left = max(0.0, broken_since + self._reconnect_s - time.monotonic())
            # Then wait for a connection, sending nothing, for what is left of the window (when it runs out, the
            # next attempt fails at once and the window is over).
            with contextlib.suppress(grpc.FutureTimeoutError):
                grpc.channel_ready_future(self._channel).result(timeout=left)

    def watch_benchmark(
        self, job_id: JobId, on_update: Callable[[WatchStep[BenchmarkJob]], None] | None = None
    ) -> BenchmarkJob:
        """The job once it has ended; ``on_update`` with each change on the way."""

        def step(update: admin_pb2.BenchmarkJobUpdate) -> None:
            if on_update is not None:
                on_update(WatchStep(benchmark_job_from_proto(update.job), update.progress.done, update.progress.total))

        last = self._watch(
            self._stub.WatchBenchmark,
            job_id,
            f"benchmark job {job_id}",
            lambda u: u.job.status != admin_pb2.BENCHMARK_JOB_STATUS_RUNNING,
            step,
            later=f"topo-tune admin bench show {job_id}",
        )
        return benchmark_job_from_proto(last.job)

    def wait_benchmark(self, job_id: JobId) -> BenchmarkJob:
        return self.watch_benchmark(job_id)

    def watch_probe_round(
        self, round_id: str, on_update: Callable[[WatchStep[ProbeRound]], None] | None = None
    ) -> ProbeRound:
        """The round once it has ended; ``on_update`` with each change on the way."""

        def step(update: admin_pb2.ProbeRoundUpdate) -> None:
            if on_update is not None:
                on_update(WatchStep(probe_round_from_proto(update.round), update.progress.done, update.progress.total))

        last = self._watch(
            self._stub.WatchProbeRound,
            round_id,
            f"probe round {round_id}",
            lambda u: u.round.status != admin_pb2.PROBE_ROUND_STATUS_RUNNING,
            step,
            later=f"topo-tune admin probe show {round_id}",
        )
        return probe_round_from_proto(last.round)

    def wait_probe_round(self, round_id: str) -> ProbeRound:
        return self.watch_probe_round(round_id)

    def watch_drift_check(
        self, check_id: str, on_update: Callable[[WatchStep[DriftCheck]], None] | None = None
    ) -> DriftCheck:
        """The check once it has ended; ``on_update`` with each change on the way."""

        def step(update: admin_pb2.DriftCheckUpdate) -> None:
            if on_update is not None:
                on_update(WatchStep(drift_check_from_proto(update.check), update.progress.done, update.progress.total))

        last = self._watch(
            self._stub.WatchDriftCheck,
            check_id,
            f"drift check {check_id}",
            lambda u: u.check.status != "running",
            step,
            later=f"topo-tune admin drift show {check_id}",
        )
        return drift_check_from_proto(last.check)

    def watch_rollout(
        self, rollout_id: RolloutId, on_update: Callable[[WatchStep[RolloutInfo]], None] | None = None
    ) -> RolloutInfo:
        """The rollout once it has ended (completed, rolled back or aborted) or waits for an operator (paused).

        ``on_update`` with each change (its ``done`` and ``total``: waves).
        """

        def step(update: admin_pb2.RolloutUpdate) -> None:
            if on_update is not None:
                rollout = rollout_info_from_proto(update.rollout)
                on_update(WatchStep(rollout, update.progress.done, update.progress.total))

        def ended(update: admin_pb2.RolloutUpdate) -> bool:
            rollout = rollout_info_from_proto(update.rollout)
            return rollout.ended or rollout.waits_for_operator

        what, later = f"rollout {rollout_id}", f"topo-tune admin rollout status {rollout_id}"
        last = self._watch(self._stub.WatchRollout, rollout_id, what, ended, step, later=later)
        return rollout_info_from_proto(last.rollout)

    def watch_study(self, study_id: StudyId, on_update: Callable[[WatchStep[Study]], None] | None = None) -> Study:
        """The study once it has ended (succeeded, failed or cancelled); ``on_update`` with each change."""

        def step(update: admin_pb2.StudyUpdate) -> None:
            if on_update is not None:
                on_update(WatchStep(from_proto_study(update.study), update.progress.done, update.progress.total))

        def ended(update: admin_pb2.StudyUpdate) -> bool:
            return update.study.status != admin_pb2.STUDY_STATUS_RUNNING

        what, later = f"study {study_id}", f"topo-tune admin study status {study_id}"
        return from_proto_study(self._watch(self._stub.WatchStudy, study_id, what, ended, step, later=later).study)

    def list_nodes(self, *, rack: str = "") -> list[NodeInfo]:
        found = self._call(self._stub.ListNodes, admin_pb2.ListNodesRequest(rack=rack)).nodes
        return [node_from_proto(node) for node in found]

    def get_node(self, name: NodeName) -> NodeInfo:
        """The node with its discovered topology."""
        return node_from_proto(self._call(self._stub.GetNode, admin_pb2.GetNodeRequest(name=name)))

    def send_command(self, node: NodeName, command: NodeCommand, *, command_id: str = "") -> CommandInfo:
        """Send ``command`` to ``node``'s agent (delivered when it next connects); ``command_id``: your own, for
        idempotent retries ("": the controller picks one)."""
        request = send_command_to_proto(node, command, command_id=command_id)
        return command_from_proto(self._call(self._stub.SendCommand, request))

    def send_commands(
        self, nodes: Sequence[NodeName], command: NodeCommand, *, command_id_prefix: str = ""
    ) -> list[CommandInfo]:
        """One fan-out to ``nodes`` (none: every node the controller knows); with a prefix, ids are PREFIX-NODE."""
        request = send_commands_to_proto(list(nodes), command, command_id_prefix=command_id_prefix)
        return [command_from_proto(info) for info in self._call(self._stub.SendCommands, request).commands]

    def get_command(self, command_id: str) -> CommandInfo:
        request = admin_pb2.GetCommandRequest(command_id=command_id)
        return command_from_proto(self._call(self._stub.GetCommand, request))

    def cluster_topology(self) -> NodeInventory:
        """Every node with its topology, and the spine as cluster.yaml names it."""
        request = admin_pb2.GetClusterTopologyRequest()
        return node_inventory_from_proto(self._call(self._stub.GetClusterTopology, request))

    def start_benchmark(self, request: BenchmarkRequest) -> BenchmarkJob:
        return benchmark_job_from_proto(self._call(self._stub.StartBenchmark, benchmark_request_to_proto(request)))

    def get_benchmark(self, job_id: JobId) -> BenchmarkJob:
        request = admin_pb2.GetBenchmarkRequest(job_id=job_id)
        return benchmark_job_from_proto(self._call(self._stub.GetBenchmark, request))

    def list_benchmarks(self, *, limit: int = 0) -> list[BenchmarkJob]:
        found = self._call(self._stub.ListBenchmarks, admin_pb2.ListBenchmarksRequest(limit=limit)).jobs
        return [benchmark_job_from_proto(job) for job in found]

    def start_probe_round(self, request: ProbeRequest) -> ProbeRound:
        return probe_round_from_proto(self._call(self._stub.StartProbeRound, probe_request_to_proto(request)))

    def get_probe_round(self, round_id: str) -> ProbeRound:
        request = admin_pb2.GetProbeRoundRequest(round_id=round_id)
        return probe_round_from_proto(self._call(self._stub.GetProbeRound, request))

    def measured_pairs(self) -> list[PairMeasurement]:
        found = self._call(self._stub.GetMeasuredPairs, admin_pb2.GetMeasuredPairsRequest())
        return [pair_from_proto(pair) for pair in found.pairs]

    def put_config_version(
        self, files: dict[str, str], provenance: dict[str, str], *, version_id: str = ""
    ) -> admin_pb2.ConfigVersionInfo:
        request = admin_pb2.PutConfigVersionRequest(files=files, provenance=provenance, id=version_id)
        return self._call(self._stub.PutConfigVersion, request)

    def get_config_version(self, version_id: ConfigVersionId) -> admin_pb2.ConfigVersionInfo:
        return self._call(self._stub.GetConfigVersion, admin_pb2.GetConfigVersionRequest(id=version_id))

    def set_version_learning(self, version_id: ConfigVersionId, *, stopped: bool, actor: str = "") -> bool:
        """Set (``stopped``) or clear a version's kill switch for learning; the switch as stored after."""
        request = admin_pb2.SetVersionLearningRequest(id=version_id, stopped=stopped, actor=actor)
        return self._call(self._stub.SetVersionLearning, request).learning_stopped

    def learning_evidence(self, version_id: ConfigVersionId) -> VersionEvidence:
        """What the version's learning jobs showed (``docs/learning.md``)."""
        from topo_tune.learning.version_evidence import EvidenceCell, VersionEvidence  # noqa: PLC0415 - heavy

        answer = self._call(self._stub.GetLearningEvidence, admin_pb2.GetLearningEvidenceRequest(id=version_id))
        cells = [
            EvidenceCell(
                c.arm, c.collective, c.class_bytes, c.speedup, c.ci_low, c.ci_high, c.jobs, c.decision, c.applies
            )
            for c in answer.cells
        ]
        jobs = dict(sorted(answer.jobs_by_arm.items()))
        return VersionEvidence(
            answer.id, jobs, list(answer.divergent), cells, list(answer.proposable), answer.learning_stopped,
            answer.learning_stopped_why,
        )  # fmt: skip

    def propose_learned_version(self, version_id: ConfigVersionId, arm: int, *, actor: str = "") -> ConfigVersionId:
        """Store challenger ``arm`` of the version as a new version; its id."""
        request = admin_pb2.ProposeLearnedVersionRequest(id=version_id, arm=arm, actor=actor)
        return ConfigVersionId(self._call(self._stub.ProposeLearnedVersion, request).id)

    def list_config_versions(self, *, limit: int = 0) -> list[admin_pb2.ConfigVersionInfo]:
        request = admin_pb2.ListConfigVersionsRequest(limit=limit)
        return list(self._call(self._stub.ListConfigVersions, request).versions)

    def start_study(self, request: StudyRequest) -> Study:
        return from_proto_study(self._call(self._stub.StartStudy, to_proto_study_request(request)))

    def get_study(self, study_id: StudyId) -> Study:
        return from_proto_study(self._call(self._stub.GetStudy, admin_pb2.GetStudyRequest(study_id=study_id)))

    def list_studies(self, *, limit: int = 0) -> list[Study]:
        found = self._call(self._stub.ListStudies, admin_pb2.ListStudiesRequest(limit=limit)).studies
        return [from_proto_study(info) for info in found]

    def list_drift_checks(self, *, limit: int = 0, status: str = "") -> list[DriftCheck]:
        request = admin_pb2.ListDriftChecksRequest(limit=limit, status=status)
        return [drift_check_from_proto(check) for check in self._call(self._stub.ListDriftChecks, request).checks]

    def get_drift_check(self, check_id: str) -> DriftCheck:
        request = admin_pb2.GetDriftCheckRequest(check_id=check_id)
        return drift_check_from_proto(self._call(self._stub.GetDriftCheck, request))

    def run_drift_check(self, *, version: ConfigVersionId = NO_CONFIG_VERSION) -> DriftCheck:
        request = admin_pb2.RunDriftCheckRequest(config_version=version)
        return drift_check_from_proto(self._call(self._stub.RunDriftCheck, request))

    def study_trials(self, study_id: StudyId) -> StudyTrials:
        request = admin_pb2.GetStudyRequest(study_id=study_id)
        return from_proto_study_trials(self._call(self._stub.ListStudyTrials, request))

    def cancel_study(self, study_id: StudyId) -> Study:
        return from_proto_study(self._call(self._stub.CancelStudy, admin_pb2.GetStudyRequest(study_id=study_id)))

    def list_commands(self, *, node_name: str = "", limit: int = 0) -> list[CommandInfo]:
        request = admin_pb2.ListCommandsRequest(node_name=node_name, limit=limit)
        return [command_from_proto(info) for info in self._call(self._stub.ListCommands, request).commands]

    # -- rollouts and job configs ---------------------------------------------------------------------------

    def create_rollout(self, request: RolloutRequest) -> RolloutInfo:
        """The rollout as created, or (``request.dry_run``) the plan it would follow, nothing stored."""
        return rollout_info_from_proto(self._call(self._stub.CreateRollout, rollout_request_to_proto(request)))

    def get_rollout(self, rollout_id: RolloutId = NO_ROLLOUT) -> RolloutInfo:
        """The rollout; no id: the active one, else the latest."""
        request = admin_pb2.GetRolloutRequest(rollout_id=rollout_id)
        return rollout_info_from_proto(self._call(self._stub.GetRollout, request))

    def list_rollouts(self, *, limit: int = 0) -> list[RolloutInfo]:
        """Newest first, each without its waves and gates."""
        found = self._call(self._stub.ListRollouts, admin_pb2.ListRolloutsRequest(limit=limit)).rollouts
        return [rollout_info_from_proto(info) for info in found]

    def change_rollout(
        self, rollout_id: RolloutId, action: RolloutAction, *, reason: str = "", actor: str = ""
    ) -> RolloutInfo:
        wire_action = ROLLOUT_ACTION_TO_WIRE[action]
        request = admin_pb2.ChangeRolloutRequest(rollout_id=rollout_id, action=wire_action, reason=reason, actor=actor)
        return rollout_info_from_proto(self._call(self._stub.ChangeRollout, request))

    def rollout_history(self, rollout_id: RolloutId) -> list[RolloutTransition]:
        request = admin_pb2.GetRolloutHistoryRequest(rollout_id=rollout_id)
        found = self._call(self._stub.GetRolloutHistory, request).transitions
        return [rollout_transition_from_proto(transition) for transition in found]

    def issue_credential(self, role: IssuedRole, node_name: str = "", *, scope: str = "") -> IssuedToken:
        request = admin_pb2.IssueCredentialRequest(role=ROLE_TO_WIRE[role], node_name=node_name, scope=scope)
        issued = self._call(self._stub.IssueCredential, request)
        return IssuedToken(id=issued.id, token=issued.token)

    def list_credentials(self) -> list[CredentialEntry]:
        found = self._call(self._stub.ListCredentials, admin_pb2.ListCredentialsRequest()).credentials
        return [credential_entry(info) for info in found]

    def revoke_credential(self, credential_id: str) -> CredentialEntry:
        request = admin_pb2.RevokeCredentialRequest(id=credential_id)
        return credential_entry(self._call(self._stub.RevokeCredential, request))

    def resolve_job_config(
        self,
        job_id: str,
        nodes: list[str],
        *,
        arm: str = "",
        preview: bool = False,
        schedule_wait_s: int = 0,
        may_learn: bool = False,
    ) -> JobConfig:
        """The job's pinned config and node order; ``arm``: "" the job's own, else a version id, "stable" or
        "defaults" (pinned per job id and arm); ``preview``: the answer without pinning it. No ``nodes``: a
        controller in Kubernetes mode reads them from the Job or JobSet whose uid ``job_id`` is, waiting up to
        ``schedule_wait_s`` (0: its default, 120 s) for its pods to be scheduled. ``may_learn``: the caller
        can run a learning arm and ship its timing records (``docs/learning.md``). An answer whose names are not
        what they claim (a node name with a newline) raises ``UnsafeAnswer`` (``job_answer.py``)."""
        request = admin_pb2.ResolveJobConfigRequest(
            job_id=job_id, nodes=nodes, arm=arm, preview=preview, schedule_wait_s=schedule_wait_s, may_learn=may_learn
        )
        waits = 0.0 if nodes else float(schedule_wait_s or 120)
        answer = self._call(self._stub.ResolveJobConfig, request, longer_by_s=waits)
        return checked_job_config(job_config_from_proto(answer), controller=self.address)

    def record_job_timing(self, job_id: str, node: str, records: list[str]) -> int:
        """Send a learning job's timing records (each a record file's text); how many were new."""
        request = admin_pb2.RecordJobTimingRequest(job_id=job_id, node=node, records=records)
        return self._call(self._stub.RecordJobTiming, request).stored

    def record_job_comparison(self, header: ComparisonHeader, runs: Sequence[RunValue]) -> StoredComparison:
        """Record the runs this node read; the comparison as it stands after (its figures once every run is in)."""
        request = job_comparison_request_to_proto(header, runs)
        return job_comparison_from_proto(self._call(self._stub.RecordJobComparison, request))

    def list_job_comparisons(self, *, job_id: str = "", limit: int = 50) -> list[StoredComparison]:
        """Up to ``limit``, newest first, page by page (the controller cuts pages by size)."""
        found: list[StoredComparison] = []
        token = ""
        while len(found) < limit:
            request = admin_pb2.ListJobComparisonsRequest(job_id=job_id, limit=limit - len(found), page_token=token)
            page = self._call(self._stub.ListJobComparisons, request)
            found.extend(job_comparison_from_proto(comparison) for comparison in page.comparisons)
            token = page.next_page_token
            if not token:
                break
        return found
