"""Domain objects ↔ admin API messages: the controller's ``to_proto_*`` and ``from_proto_*`` (benchmark jobs'
and probe rounds' in ``wire/admin_jobs.py``, which the tuning pass's client side shares).

The servicers (and the in-process port of a study) convert here, at the edge; the services below take and
return their own frozen dataclasses and never see an ``admin_pb2`` message. Non-goals: validation of a
request (``validation.py``), error mapping (``status_codes.py``).
"""

from __future__ import annotations

from topo_tune.benchmark.probe_record import ProbeRound
from topo_tune.controller import names
from topo_tune.controller.benchmarks.service import JobProgress
from topo_tune.controller.commands import CommandRecord
from topo_tune.controller.config_versions import StoredVersion
from topo_tune.controller.nodes import NodeView
from topo_tune.controller.rollout.job_pins import ResolvedJob
from topo_tune.controller.rollout.state import Snapshot, WavePhase
from topo_tune.drift_record import DriftCheck
from topo_tune.errors import ValidationError
from topo_tune.ids import NodeName
from topo_tune.jobs.compare.comparison_record import ComparisonHeader
from topo_tune.jobs.compare.schedule import MAX_PAIRS, Arm
from topo_tune.jobs.compare.summary import RunValue
from topo_tune.jobs.config import LearningPin
from topo_tune.jobs.job_config import JobConfig
from topo_tune.study_record import Study
from topo_tune.v1 import admin_pb2, agent_pb2
from topo_tune.wire.admin_jobs import benchmark_job_to_proto, probe_round_to_proto
from topo_tune.wire.commands import command_to_proto
from topo_tune.wire.drift_checks import drift_check_to_proto
from topo_tune.wire.job_configs import job_config_to_proto
from topo_tune.wire.nodes import node_to_proto
from topo_tune.wire.studies import to_proto_study
from topo_tune.wire.values import timestamp


def to_proto_node(view: NodeView, *, with_topology: bool) -> admin_pb2.Node:
    return node_to_proto(view.info(with_topology=with_topology))


def to_proto_cluster_topology(
    views: list[NodeView], spine: tuple[float | None, float | None]
) -> admin_pb2.ClusterTopologyView:
    """Every node with its topology, and the spine from cluster.yaml: what ``admin topology`` renders."""
    view = admin_pb2.ClusterTopologyView(nodes=[to_proto_node(v, with_topology=True) for v in views])
    oversubscription, bandwidth = spine
    if oversubscription is not None:
        view.spine_oversubscription = oversubscription
    if bandwidth is not None:
        view.spine_bandwidth_gbps = bandwidth
    return view


def to_proto_command(record: CommandRecord) -> admin_pb2.CommandInfo:
    return command_to_proto(record.info())


def from_proto_command_body(
    request: admin_pb2.SendCommandRequest | admin_pb2.SendCommandsRequest,
) -> agent_pb2.Command:
    command = agent_pb2.Command()
    kind = request.WhichOneof("body")
    if kind == "rediscover":
        command.rediscover.CopyFrom(request.rediscover)
    elif kind == "drain":
        command.drain.CopyFrom(request.drain)
    else:  # pragma: no cover - validation refuses it
        raise ValidationError("body", f"unsupported command {kind!r}")
    return command


def to_proto_job_config(resolved: ResolvedJob, *, preview: bool = False) -> admin_pb2.JobConfig:
    order, pin = resolved.order, resolved.pin
    measured, edges = order.measured_edges
    config = JobConfig(
        job_id="" if preview and pin.job_id == "preview" else pin.job_id,
        config_version=pin.version,
        files=resolved.files,
        nodes=tuple(NodeName(n) for n in pin.nodes),
        rollout_id=resolved.rollout_id,
        node_order=tuple(NodeName(n) for n in pin.order),
        master_addr=resolved.master_addr,
        order_method=order.method,
        order_bottleneck_gbps=order.bottleneck_gbps,
        given_bottleneck_gbps=order.given_bottleneck_gbps,
        measured_edges=measured,
        ring_edges=edges,
        warnings=order.warnings,
        arm=pin.arm,
        learning=None if pin.learning_arm is None else LearningPin(pin.learning_arm, resolved.timing_sample),
    )
    return job_config_to_proto(config)


def to_proto_config_version(version: StoredVersion) -> admin_pb2.ConfigVersionInfo:
    return admin_pb2.ConfigVersionInfo(
        id=version.id,
        files=dict(version.files),
        provenance=dict(version.provenance),
        created_at=timestamp(version.created_at),
        learning_stopped=version.learning_stopped,
        learning_stopped_why=version.learning_stopped_why,
    )


# -- watch streams: each update is the object and its progress ------------------------------------------------


def to_proto_job_update(found: JobProgress) -> admin_pb2.BenchmarkJobUpdate:
    progress = admin_pb2.Progress(done=found.nodes_done, total=found.nodes_total)
    return admin_pb2.BenchmarkJobUpdate(job=benchmark_job_to_proto(found.job), progress=progress)


def to_proto_round_update(found: ProbeRound) -> admin_pb2.ProbeRoundUpdate:
    progress = admin_pb2.Progress(done=len(found.measurements), total=found.pairs_total)
    return admin_pb2.ProbeRoundUpdate(round=probe_round_to_proto(found), progress=progress)


def to_proto_check_update(found: tuple[DriftCheck, int]) -> admin_pb2.DriftCheckUpdate:
    check, ended = found
    progress = admin_pb2.Progress(done=ended, total=len(check.job_ids))
    return admin_pb2.DriftCheckUpdate(check=drift_check_to_proto(check), progress=progress)


def to_proto_rollout_update(rollout: admin_pb2.RolloutInfo, snapshot: Snapshot) -> admin_pb2.RolloutUpdate:
    done = sum(1 for wave in snapshot.waves if wave.phase is WavePhase.COMPLETED)
    return admin_pb2.RolloutUpdate(rollout=rollout, progress=admin_pb2.Progress(done=done, total=len(snapshot.waves)))


def to_proto_study_update(found: Study) -> admin_pb2.StudyUpdate:
    progress = admin_pb2.Progress(done=found.done, total=found.total)
    return admin_pb2.StudyUpdate(study=to_proto_study(found), progress=progress)


MAX_COMPARISON_NODES = 100_000
"""As many nodes as a job's config may name."""


def _arm_name(value: str, field: str) -> str:
    if not value:
        raise ValidationError(field, "required: a version id, stable or defaults")
    return names.short_text(value, field, limit=128)


def from_proto_job_comparison(
    request: admin_pb2.RecordJobComparisonRequest,
) -> tuple[ComparisonHeader, list[RunValue]]:
    """A node's record, checked field by field (the schedule and orders are checked by the store)."""
    job_id = names.job_id(request.job_id)
    if not request.metric:
        raise ValidationError("metric", "required")
    if not 2 <= request.pairs <= MAX_PAIRS:
        raise ValidationError("pairs", f"must be within [2, {MAX_PAIRS}], got {request.pairs}")
    if not request.nodes or len(request.nodes) > MAX_COMPARISON_NODES:
        raise ValidationError("nodes", f"a job has 1 to {MAX_COMPARISON_NODES} nodes, got {len(request.nodes)}")
    for field in ("nodes", "candidate_order", "against_order"):
        for index, node in enumerate(getattr(request, field)):
            names.node_name(node, f"{field}[{index}]")
    if len(request.runs) > 2 * request.pairs:
        raise ValidationError("runs", f"{len(request.runs)} runs, more than the {2 * request.pairs} of the schedule")
    arms = {arm.value: arm for arm in Arm}
    runs = []
    for index, run in enumerate(request.runs):
        if run.arm not in arms:
            raise ValidationError(f"runs[{index}].arm", f"one of {', '.join(arms)}, got {run.arm[:40]!r}")
        runs.append(RunValue(index=run.index, pair=run.pair, arm=arms[run.arm], value=run.value, node=run.node))
    header = ComparisonHeader(
        job_id=job_id,
        candidate=_arm_name(request.candidate, "candidate"),
        candidate_version=names.short_text(request.candidate_version, "candidate_version", limit=128),
        against=_arm_name(request.against, "against"),
        against_version=names.short_text(request.against_version, "against_version", limit=128),
        metric=names.short_text(request.metric, "metric", limit=1000),
        higher_is_better=request.higher_is_better,
        pairs=request.pairs,
        nodes=tuple(request.nodes),
        candidate_order=tuple(request.candidate_order),
        against_order=tuple(request.against_order),
    )
    return header, runs
