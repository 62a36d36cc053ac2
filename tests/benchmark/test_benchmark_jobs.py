"""Controller-side job planning: rank maps, aggregation and probe rounds."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.results import NcclChoice, RankResult, SizeMeasurement
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import (
    JobNode,
    JobStatus,
    aggregate,
    missing_ranks,
    plan_job,
    probe_rounds,
    summarize,
)
from topo_tune.errors import SpecError
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import rank_result_to_proto

NODES = (JobNode("b", "10.0.0.2", 8), JobNode("a", "10.0.0.1", 8), JobNode("c", "10.0.0.3", 4))


def _plan(**kwargs: object) -> object:
    args: dict[str, object] = {
        "job_id": "job-1",
        "collective": Collective.ALL_REDUCE,
        "sweep": SizeSweep(1024, 1 << 20, 4),
        "dtype": dtype_named("float32"),
        "nodes": NODES,
        "rendezvous_port": 29500,
        "env": {"NCCL_MIN_CTAS": "16"},
        "gpu_devices": True,
    }
    args.update(kwargs)
    return plan_job(**args)  # type: ignore[arg-type]


def test_ranks_follow_the_node_order_contiguously() -> None:
    spec = _plan()
    assert spec.world_size == 12  # the smallest node holds 4
    assert [(s.rank, s.node_name, s.local_rank, s.device) for s in spec.ranks[:5]] == [
        (0, "b", 0, 0),
        (1, "b", 1, 1),
        (2, "b", 2, 2),
        (3, "b", 3, 3),
        (4, "a", 0, 0),
    ]
    assert (spec.rendezvous_host, spec.rendezvous_port) == ("10.0.0.2", 29500)  # rank 0's node
    assert [s.rank for s in spec.local_slots("c")] == [8, 9, 10, 11]


def test_cpu_jobs_place_no_devices_and_bad_plans_name_the_argument() -> None:
    assert {s.device for s in _plan(gpu_devices=False, ranks_per_node=2).ranks} == {-1}
    with pytest.raises(SpecError, match="ranks_per_node=8"):
        _plan(ranks_per_node=8)
    with pytest.raises(SpecError, match="twice"):
        _plan(nodes=(NODES[0], NODES[0]))
    with pytest.raises(SpecError, match="nodes is empty"):
        _plan(nodes=())


def _size(time_us: float, *, wrong: int = 0, size: int = 1 << 20) -> SizeMeasurement:
    return SizeMeasurement(size, size // 4, True, time_us, 0.0, 0.0, wrong, True, time_us, time_us * 1.1, 0.02)


def test_aggregate_takes_the_slowest_rank_and_sums_wrong_elements() -> None:
    spec = _plan(nodes=(JobNode("a", "h", 1), JobNode("b", "h2", 1)), sweep=SizeSweep(1 << 20, 1 << 20, 0))
    results = [
        RankResult("job-1", 0, (_size(100.0),)),
        RankResult("job-1", 1, (_size(250.0, wrong=2),)),
    ]
    (row,) = aggregate(spec, results)
    assert row.time_us == 250.0
    assert row.algbw_gbps == pytest.approx((1 << 20) / 1e9 / 250e-6)
    assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 1.0)  # 2(n-1)/n with n=2
    assert row.wrong == 2
    assert missing_ranks(spec, results[:1]) == (1,)
    with pytest.raises(ValueError, match=r"ranks \[1\]"):
        aggregate(spec, results[:1])


def test_aggregate_keeps_nccls_reported_choice() -> None:
    spec = _plan(nodes=(JobNode("a", "h", 1), JobNode("b", "h2", 1)), sweep=SizeSweep(1 << 20, 1 << 20, 0))
    choice = NcclChoice(("tree/ll", "ring/simple"), "tree/ll", "ring/simple", 0)
    results = [
        RankResult("job-1", 0, (dataclasses.replace(_size(100.0), choice=choice),)),
        RankResult("job-1", 1, (_size(250.0),)),  # a rank without the record (no plugin library there)
    ]
    (row,) = aggregate(spec, results)
    assert (row.time_us, row.choice) == (250.0, choice)


@given(st.integers(min_value=0, max_value=40))
def test_probe_rounds_cover_every_pair_once_in_linear_rounds(n: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    rounds = probe_rounds(nodes)
    pairs = [frozenset(p) for r in rounds for p in r]
    assert len(pairs) == len(set(pairs)) == n * (n - 1) // 2
    assert set(pairs) == {frozenset(p) for p in itertools.combinations(nodes, 2)}
    for r in rounds:  # a node probes at most one peer per round
        busy = [x for p in r for x in p]
        assert len(busy) == len(set(busy))
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


def _node_result(
    status: int, ranks: list[RankResult], statuses: list[agent_pb2.RankStatus], message: str = ""
) -> agent_pb2.CommandResult:
    result = agent_pb2.CommandResult(status=status, message=message)  # type: ignore[arg-type]
    result.node_benchmark.ranks.extend(rank_result_to_proto(r) for r in ranks)
    result.node_benchmark.rank_status.extend(statuses)
    return result


def _two_node_spec() -> object:
    return _plan(nodes=(JobNode("a", "h", 1), JobNode("b", "h2", 1)), sweep=SizeSweep(1 << 20, 1 << 20, 0))


def test_summarize_a_job_whose_nodes_all_succeeded() -> None:
    spec = _two_node_spec()
    finished = agent_pb2.RankStatus(outcome=agent_pb2.RANK_OUTCOME_FINISHED, phase="finished", joined=True)
    results = {
        "a": _node_result(agent_pb2.COMMAND_STATUS_SUCCEEDED, [RankResult("job-1", 0, (_size(100.0),))], [finished]),
        "b": _node_result(agent_pb2.COMMAND_STATUS_SUCCEEDED, [RankResult("job-1", 1, (_size(120.0),))], [finished]),
    }
    summary = summarize(spec, results)  # type: ignore[arg-type]
    assert summary.status is JobStatus.SUCCEEDED
    assert [m.time_us for m in summary.rows] == [120.0]
    assert summary.missing_ranks == summary.hung_ranks == ()


def test_summarize_names_hung_and_missing_ranks() -> None:
    spec = _two_node_spec()
    waiting = agent_pb2.RankStatus(rank=0, outcome=agent_pb2.RANK_OUTCOME_HUNG, phase="rendezvous", waiting_for=[1])
    summary = summarize(spec, {"a": _node_result(agent_pb2.COMMAND_STATUS_TIMED_OUT, [], [waiting], "timed out")})  # type: ignore[arg-type]
    assert summary.status is JobStatus.TIMED_OUT
    assert (summary.hung_ranks, summary.missing_ranks) == ((0,), (1,))
    assert "b: no result" in summary.message and summary.rows == ()


def test_summarize_fails_a_job_with_a_wrong_element() -> None:
    spec = _two_node_spec()
    finished = agent_pb2.RankStatus(outcome=agent_pb2.RANK_OUTCOME_FINISHED, phase="finished", joined=True)
    results = {
        "a": _node_result(agent_pb2.COMMAND_STATUS_SUCCEEDED, [RankResult("job-1", 0, (_size(100.0),))], [finished]),
        "b": _node_result(
            agent_pb2.COMMAND_STATUS_FAILED, [RankResult("job-1", 1, (_size(100.0, wrong=3),))], [finished], "wrong"
        ),
    }
    summary = summarize(spec, results)  # type: ignore[arg-type]
    assert (summary.status, summary.wrong) == (JobStatus.FAILED, 3)
