"""Benchmark jobs and probe rounds ↔ the admin API's messages, both ways, in one place.

The controller's servicers send a job or a round (``*_to_proto``) and read a request (``*_from_proto``); the
tuning pass over the admin client (``tuning_pass/remote_port.py``) does the reverse. Each status table is
written once and inverted, and a round trip through the wire gives the same object back
(``tests/test_admin_jobs_wire.py``). Non-goals: validating a request (``controller/api/validation.py``),
gRPC.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobStatus, NextSpecRequest, SizeRange
from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound, ProbeStatus
from topo_tune.ids import JobId
from topo_tune.v1 import admin_pb2, agent_pb2
from topo_tune.wire.benchmark import (
    COLLECTIVE_FROM_PROTO,
    COLLECTIVE_TO_PROTO,
    collective_from_proto,
    size_from_proto,
    size_to_proto,
)
from topo_tune.wire.plain_data import to_data
from topo_tune.wire.values import BACKEND_FROM_WIRE, backend_to_wire, timestamp, timestamp_or_none

JOB_STATUS_TO_WIRE: dict[JobStatus, admin_pb2.BenchmarkJobStatus.ValueType] = {
    JobStatus.RUNNING: admin_pb2.BENCHMARK_JOB_STATUS_RUNNING,
    JobStatus.SUCCEEDED: admin_pb2.BENCHMARK_JOB_STATUS_SUCCEEDED,
    JobStatus.FAILED: admin_pb2.BENCHMARK_JOB_STATUS_FAILED,
    JobStatus.TIMED_OUT: admin_pb2.BENCHMARK_JOB_STATUS_TIMED_OUT,
}
JOB_STATUS_FROM_WIRE = {wire: status for status, wire in JOB_STATUS_TO_WIRE.items()}

PROBE_STATUS_TO_WIRE: dict[ProbeStatus, admin_pb2.ProbeRoundStatus.ValueType] = {
    ProbeStatus.RUNNING: admin_pb2.PROBE_ROUND_STATUS_RUNNING,
    ProbeStatus.SUCCEEDED: admin_pb2.PROBE_ROUND_STATUS_SUCCEEDED,
    ProbeStatus.FAILED: admin_pb2.PROBE_ROUND_STATUS_FAILED,
}
PROBE_STATUS_FROM_WIRE = {wire: status for status, wire in PROBE_STATUS_TO_WIRE.items()}

PROBE_SAMPLING: dict[str, admin_pb2.ProbeSampling.ValueType] = {
    "auto": admin_pb2.PROBE_SAMPLING_UNSPECIFIED,
    "full": admin_pb2.PROBE_SAMPLING_FULL,
    "sparse": admin_pb2.PROBE_SAMPLING_SPARSE,
}
"""``--sampling`` / cluster.yaml ``search.probeSampling`` names on the wire; auto (a round's ``""``): the
controller's default, or a round of listed pairs."""
PROBE_SAMPLING_NAMES = {wire: name for name, wire in PROBE_SAMPLING.items()}

if (
    set(JOB_STATUS_TO_WIRE) != set(JobStatus)
    or set(PROBE_STATUS_TO_WIRE) != set(ProbeStatus)
    or len(JOB_STATUS_FROM_WIRE) != len(JOB_STATUS_TO_WIRE)
    or len(PROBE_STATUS_FROM_WIRE) != len(PROBE_STATUS_TO_WIRE)
):  # pragma: no cover - an import-time check that the tables are total and one-to-one
    raise RuntimeError("every job and probe status needs its own wire value")


def _sweep_to_proto(sizes: SizeRange) -> agent_pb2.SizeSweep:
    return agent_pb2.SizeSweep(min_bytes=sizes.min_bytes, max_bytes=sizes.max_bytes, step_factor=sizes.step_factor)


def _sweep_from_proto(sizes: agent_pb2.SizeSweep) -> SizeRange:
    return SizeRange(sizes.min_bytes, sizes.max_bytes, sizes.step_factor)


def benchmark_request_to_proto(request: BenchmarkRequest) -> admin_pb2.StartBenchmarkRequest:
    collective = request.collective
    return admin_pb2.StartBenchmarkRequest(
        collective=agent_pb2.COLLECTIVE_UNSPECIFIED if collective is None else COLLECTIVE_TO_PROTO[collective],
        nodes=list(request.nodes),
        sizes=_sweep_to_proto(request.sizes),
        dtype=request.dtype,
        warmup_iters=request.warmup_iters,
        iters=request.iters,
        env=dict(request.env),
        ranks_per_node=request.ranks_per_node,
        deadline_s=request.deadline_s,
        both_placements=request.both_placements,
        job_id=request.job_id,
        tuner_table=request.tuner_table,
        cuda_graph=request.cuda_graph,
        sim_seed=request.sim_seed,
        next_specs=[
            admin_pb2.NextSpecRequest(
                collective=agent_pb2.COLLECTIVE_UNSPECIFIED
                if n.collective is None
                else COLLECTIVE_TO_PROTO[n.collective],
                nodes=list(n.nodes),
                sizes=_sweep_to_proto(n.sizes),
                env=dict(n.env),
                tuner_table=n.tuner_table,
                sim_seed=n.sim_seed,
            )
            for n in request.next_specs
        ],
    )


def benchmark_request_from_proto(request: admin_pb2.StartBenchmarkRequest) -> BenchmarkRequest:
    """The request as sent; an unknown collective is ``None`` for the service to refuse by name."""
    return BenchmarkRequest(
        collective=COLLECTIVE_FROM_PROTO.get(request.collective),
        nodes=tuple(request.nodes),
        sizes=_sweep_from_proto(request.sizes),
        dtype=request.dtype,
        warmup_iters=request.warmup_iters,
        iters=request.iters,
        env=dict(request.env),
        ranks_per_node=request.ranks_per_node,
        deadline_s=request.deadline_s,
        both_placements=request.both_placements,
        job_id=request.job_id,
        tuner_table=request.tuner_table,
        cuda_graph=request.cuda_graph,
        sim_seed=request.sim_seed if request.HasField("sim_seed") else None,
        next_specs=tuple(
            NextSpecRequest(
                collective=COLLECTIVE_FROM_PROTO.get(n.collective),
                nodes=tuple(n.nodes),
                sizes=_sweep_from_proto(n.sizes),
                env=dict(n.env),
                tuner_table=n.tuner_table,
                sim_seed=n.sim_seed if n.HasField("sim_seed") else None,
            )
            for n in request.next_specs
        ),
    )


def benchmark_job_to_proto(job: BenchmarkJob) -> admin_pb2.BenchmarkJob:
    return admin_pb2.BenchmarkJob(
        job_id=job.job_id,
        status=JOB_STATUS_TO_WIRE[job.status],
        message=job.message,
        collective=COLLECTIVE_TO_PROTO[job.collective],
        nodes=list(job.nodes),
        world_size=job.world_size,
        dtype=job.dtype,
        env=dict(job.env),
        sizes=[size_to_proto(m) for m in job.sizes],
        missing_ranks=list(job.missing_ranks),
        hung_ranks=list(job.hung_ranks),
        simulated=job.simulated,
        created_at=timestamp(job.created_at),
        finished_at=timestamp_or_none(job.finished_at),
        backend=backend_to_wire(job.backend),
        sizes_requested=_sweep_to_proto(job.sizes_requested),
        iters=job.iters,
        warmup_iters=job.warmup_iters,
        cuda_graph=job.cuda_graph,
        tuner_table_sha256=job.tuner_table_sha256,
    )


def benchmark_job_from_proto(job: admin_pb2.BenchmarkJob) -> BenchmarkJob:
    return BenchmarkJob(
        job_id=JobId(job.job_id),
        status=JOB_STATUS_FROM_WIRE[job.status],
        message=job.message,
        collective=collective_from_proto(job.collective, field="job.collective"),
        nodes=tuple(job.nodes),
        world_size=job.world_size,
        dtype=job.dtype,
        env=dict(job.env),
        backend=BACKEND_FROM_WIRE.get(job.backend, ""),
        sizes_requested=_sweep_from_proto(job.sizes_requested),
        iters=job.iters,
        warmup_iters=job.warmup_iters,
        cuda_graph=job.cuda_graph,
        tuner_table_sha256=job.tuner_table_sha256,
        created_at=job.created_at.ToDatetime(UTC),
        simulated=job.simulated,
        sizes=tuple(size_from_proto(row) for row in job.sizes),
        missing_ranks=tuple(job.missing_ranks),
        hung_ranks=tuple(job.hung_ranks),
        finished_at=job.finished_at.ToDatetime(UTC) if job.HasField("finished_at") else None,
    )


def probe_request_to_proto(request: ProbeRequest) -> admin_pb2.StartProbeRoundRequest:
    return admin_pb2.StartProbeRoundRequest(
        nodes=list(request.nodes),
        message_bytes=request.message_bytes,
        pair_deadline_s=request.pair_deadline_s,
        sampling=PROBE_SAMPLING[request.sampling or "auto"],
        pairs=[admin_pb2.NodePair(node_a=a, node_b=b) for a, b in request.pairs],
    )


def probe_request_from_proto(request: admin_pb2.StartProbeRoundRequest) -> ProbeRequest:
    sampling = PROBE_SAMPLING_NAMES.get(request.sampling)
    return ProbeRequest(
        nodes=tuple(request.nodes),
        message_bytes=request.message_bytes,
        pair_deadline_s=request.pair_deadline_s,
        # An enum value this version does not know stays visible, so the service can refuse it by name.
        sampling=f"unknown ({request.sampling})" if sampling is None else "" if sampling == "auto" else sampling,
        pairs=tuple((p.node_a, p.node_b) for p in request.pairs),
    )


def pair_to_proto(measurement: PairMeasurement) -> admin_pb2.PairMeasurement:
    return admin_pb2.PairMeasurement(
        node_a=measurement.node_a,
        node_b=measurement.node_b,
        bandwidth_gbps=measurement.bandwidth_gbps,
        latency_us=measurement.latency_us,
        method=measurement.method,
        measured_at=timestamp(measurement.measured_at),
    )


def pair_from_proto(pair: admin_pb2.PairMeasurement) -> PairMeasurement:
    return PairMeasurement(
        node_a=pair.node_a,
        node_b=pair.node_b,
        bandwidth_gbps=pair.bandwidth_gbps,
        latency_us=pair.latency_us,
        method=pair.method,
        measured_at=pair.measured_at.ToDatetime(UTC),
    )


def probe_round_to_proto(found: ProbeRound) -> admin_pb2.ProbeRound:
    return admin_pb2.ProbeRound(
        round_id=found.round_id,
        status=PROBE_STATUS_TO_WIRE[found.status],
        message=found.message,
        nodes=list(found.nodes),
        rounds=found.rounds,
        pairs_total=found.pairs_total,
        measurements=[pair_to_proto(m) for m in found.measurements],
        sampling=PROBE_SAMPLING.get(found.sampling or "auto", admin_pb2.PROBE_SAMPLING_UNSPECIFIED),
        degraded_nodes=list(found.degraded_nodes),
        degraded_uplinks=list(found.degraded_uplinks),
        slow_pairs=[admin_pb2.NodePair(node_a=a, node_b=b) for a, b in found.slow_pairs],
    )


def probe_round_from_proto(found: admin_pb2.ProbeRound) -> ProbeRound:
    sampling = PROBE_SAMPLING_NAMES.get(found.sampling, "auto")
    return ProbeRound(
        round_id=found.round_id,
        status=PROBE_STATUS_FROM_WIRE[found.status],
        message=found.message,
        nodes=tuple(found.nodes),
        # The wire says full or sparse; a round of listed pairs (or an older controller) leaves it unset.
        sampling="" if sampling == "auto" else sampling,
        rounds=found.rounds,
        pairs_total=found.pairs_total,
        measurements=tuple(pair_from_proto(m) for m in found.measurements),
        degraded_nodes=tuple(found.degraded_nodes),
        degraded_uplinks=tuple(found.degraded_uplinks),
        slow_pairs=tuple((p.node_a, p.node_b) for p in found.slow_pairs),
    )


def probe_round_data(found: ProbeRound) -> dict[str, Any]:
    """The round as ``-o json`` prints it: its message's plain form (``plain_data.py``)."""
    return to_data(probe_round_to_proto(found))


def pair_data(measurement: PairMeasurement) -> dict[str, Any]:
    return to_data(pair_to_proto(measurement))


def benchmark_job_data(job: BenchmarkJob) -> dict[str, Any]:
    """The job as ``-o json`` prints it: its message's plain form (``plain_data.py``)."""
    return to_data(benchmark_job_to_proto(job))
