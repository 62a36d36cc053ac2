"""A benchmark job, a probe round and their requests survive the admin API's wire both ways: what the
controller sends is what the tuning pass reads (``wire/admin_jobs.py``), every field and every status."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobStatus, NextSpecRequest, SizeRange
from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound, ProbeStatus
from topo_tune.benchmark.results import NcclChoice, SizeMeasurement
from topo_tune.ids import JobId
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import admin_pb2
from topo_tune.wire import admin_jobs as wire

AT = datetime(2026, 12, 3, 9, 30, 15, 250_000, tzinfo=UTC)
ROW = SizeMeasurement(
    bytes=1 << 20,
    count=1 << 18,
    in_place=True,
    time_us=41.5,
    algbw_gbps=25.3,
    busbw_gbps=37.9,
    wrong=0,
    checked=True,
    p50_us=41.0,
    p99_us=44.2,
    cv=0.03,
    choice=NcclChoice(("ring/simple", "tree/ll"), "ring/simple", "tree/ll", 8),
)
JOB = BenchmarkJob(
    job_id=JobId("bj-1"),
    status=JobStatus.TIMED_OUT,
    message="rank 3 hung",
    collective=Collective.REDUCE_SCATTER,
    nodes=("gpu02", "gpu01"),
    world_size=16,
    dtype="bfloat16",
    env={"NCCL_ALGO": "Ring"},
    backend="nccl",
    sizes_requested=SizeRange(1 << 10, 1 << 20, 4),
    iters=20,
    warmup_iters=5,
    cuda_graph=True,
    tuner_table_sha256="ab" * 32,
    created_at=AT,
    simulated=False,
    sizes=(ROW, dataclasses.replace(ROW, in_place=False, choice=None)),
    missing_ranks=(7,),
    hung_ranks=(3,),
    finished_at=AT,
)
PAIR = PairMeasurement("gpu01", "gpu02", 48.5, 6.25, "sendrecv", AT)
ROUND = ProbeRound(
    round_id="pr-1",
    status=ProbeStatus.SUCCEEDED,
    message="",
    nodes=("gpu01", "gpu02", "gpu03"),
    sampling="sparse",
    rounds=3,
    pairs_total=3,
    measurements=(PAIR, dataclasses.replace(PAIR, node_b="gpu03", bandwidth_gbps=12.0)),
    degraded_nodes=("gpu03",),
    degraded_uplinks=("r2",),
    slow_pairs=(("gpu01", "gpu03"),),
)


@pytest.mark.parametrize("status", list(JobStatus))
def test_a_benchmark_job_reads_back_as_the_controller_sent_it(status: JobStatus) -> None:
    job = dataclasses.replace(JOB, status=status, finished_at=None if status is JobStatus.RUNNING else AT)
    assert wire.benchmark_job_from_proto(wire.benchmark_job_to_proto(job)) == job


@pytest.mark.parametrize("collective", [*Collective, None])
def test_a_benchmark_request_reaches_the_controller_as_the_pass_made_it(collective: Collective | None) -> None:
    request = BenchmarkRequest(
        collective=collective,
        nodes=("gpu02", "gpu01"),
        sizes=SizeRange(8, 1 << 30, 2),
        dtype="float",
        warmup_iters=1,
        iters=3,
        env={"NCCL_PROTO": "Simple"},
        ranks_per_node=8,
        deadline_s=90,
        both_placements=True,
        job_id="bj-2",
        tuner_table="all_reduce,0,65536,ring,simple,8\n",
        cuda_graph=True,
        sim_seed=11,
        next_specs=(
            NextSpecRequest(Collective.ALL_GATHER, ("gpu01", "gpu02"), SizeRange(8, 64, 8), {"NCCL_ALGO": "Ring"}),
            NextSpecRequest(collective, ("gpu02", "gpu01"), tuner_table="all_reduce,0,8,tree,ll,2\n", sim_seed=12),
        ),
    )
    assert wire.benchmark_request_from_proto(wire.benchmark_request_to_proto(request)) == request
    unseeded = dataclasses.replace(request, sim_seed=None)
    assert wire.benchmark_request_from_proto(wire.benchmark_request_to_proto(unseeded)) == unseeded, "unset stays unset"


@pytest.mark.parametrize("status", list(ProbeStatus))
@pytest.mark.parametrize("sampling", ["", "full", "sparse"])
def test_a_probe_round_reads_back_as_the_controller_sent_it(status: ProbeStatus, sampling: str) -> None:
    found = dataclasses.replace(ROUND, status=status, sampling=sampling)
    assert wire.probe_round_from_proto(wire.probe_round_to_proto(found)) == found


@pytest.mark.parametrize("sampling", ["", "full", "sparse"])
def test_a_probe_request_reaches_the_controller_as_the_pass_made_it(sampling: str) -> None:
    request = ProbeRequest(nodes=("a", "b"), message_bytes=1 << 24, pair_deadline_s=60, sampling=sampling)
    assert wire.probe_request_from_proto(wire.probe_request_to_proto(request)) == request
    pairs = ProbeRequest(pairs=(("a", "b"), ("b", "c")))
    assert wire.probe_request_from_proto(wire.probe_request_to_proto(pairs)) == pairs


def test_a_sampling_this_version_does_not_know_stays_visible_for_the_service_to_refuse() -> None:
    unknown = admin_pb2.StartProbeRoundRequest(sampling=7)  # type: ignore[arg-type]
    assert wire.probe_request_from_proto(unknown).sampling == "unknown (7)"


def test_each_status_has_its_own_wire_value_both_ways() -> None:
    assert sorted(wire.JOB_STATUS_FROM_WIRE) == sorted(set(wire.JOB_STATUS_TO_WIRE.values()))
    assert set(wire.JOB_STATUS_FROM_WIRE.values()) == set(JobStatus)
    assert set(wire.PROBE_STATUS_FROM_WIRE.values()) == set(ProbeStatus)
    assert admin_pb2.BENCHMARK_JOB_STATUS_UNSPECIFIED not in wire.JOB_STATUS_FROM_WIRE
