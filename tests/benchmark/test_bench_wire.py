"""The wire edge: RunBenchmark validation, round trips, and rejections before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor, probe_specs
from topo_tune.agent.bench.worker_config import WorkerConfig, WorkerFault
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import MAX_DEADLINE_S, BenchmarkSpec, RankSlot
from topo_tune.benchmark.results import NcclChoice, RankResult, SizeMeasurement
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import rank_result_from_proto, rank_result_to_proto, spec_from_proto, spec_to_proto


def _spec(**overrides: object) -> BenchmarkSpec:
    fields: dict[str, object] = {
        "job_id": "job-1",
        "collective": Collective.REDUCE_SCATTER,
        "sweep": SizeSweep(1024, 1 << 20, 4),
        "dtype": dtype_named("bfloat16"),
        "warmup_iters": 2,
        "iters": 10,
        "placements": (False, True),
        "check": True,
        "env": {"NCCL_MIN_CTAS": "8"},
        "world_size": 2,
        "ranks": (RankSlot(0, "a", 0, 0), RankSlot(1, "b", 0, 0)),
        "rendezvous_host": "10.0.0.1",
        "rendezvous_port": 29500,
    }
    fields.update(overrides)
    return BenchmarkSpec(**fields)  # type: ignore[arg-type]


def test_spec_round_trips_through_the_wire_and_json() -> None:
    spec = _spec()
    assert spec_from_proto(spec_to_proto(spec)) == spec
    assert BenchmarkSpec.from_json(spec.to_json()) == spec
    single = _spec(placements=(True,))
    msg = spec_to_proto(single)
    assert (msg.in_place, msg.both_placements) == (True, False)
    assert spec_from_proto(msg).placements == (True,)
    graphed = _spec(cuda_graph=True, tuner_table="")
    assert spec_from_proto(spec_to_proto(graphed)).cuda_graph is True
    assert BenchmarkSpec.from_json(graphed.to_json()) == graphed


def test_results_round_trip_with_placement_and_check_flags() -> None:
    row = SizeMeasurement(4096, 1024, True, 12.5, 0.3, 0.45, 0, False, 12.0, 14.0, 0.05)
    result = RankResult("job-1", 1, (row,), {"NCCL_MIN_CTAS": "8"})
    assert rank_result_from_proto(rank_result_to_proto(result)) == result


def test_nccls_choice_travels_with_its_size_through_the_wire_and_json() -> None:
    choice = NcclChoice(("tree/ll", "ring/ll", "ring/simple"), "tree/ll", "ring/simple", 8)
    rows = (
        SizeMeasurement(4096, 1024, False, 12.5, 0.3, 0.45, 0, False, 12.0, 14.0, 0.05, choice),
        SizeMeasurement(8192, 2048, False, 13.5, 0.6, 0.9, 0, False, 13.0, 15.0, 0.05),  # no record for it
    )
    result = RankResult("job-1", 0, rows)
    assert rank_result_from_proto(rank_result_to_proto(result)) == result
    assert RankResult.from_json(result.to_json()) == result
    assert not rank_result_to_proto(result).sizes[1].HasField("choice"), "unknown stays unset, not empty"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"job_id": "../etc"}, "job_id"),
        ({"iters": 0}, "iters"),
        ({"world_size": 3}, "world_size"),
        ({"ranks": (RankSlot(0, "a", 0, 0), RankSlot(0, "b", 0, 0))}, "exactly once"),
        ({"ranks": (RankSlot(0, "a", 0, 0), RankSlot(1, "a", 0, 1))}, "local_rank 0 appears twice"),
        ({"rendezvous_port": 0}, "rendezvous_port"),
        ({"rendezvous_host": ""}, "rendezvous_host"),
    ],
)
def test_bad_jobs_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        _spec(**overrides)


def test_bad_wire_values_name_the_field() -> None:
    msg = spec_to_proto(_spec())
    msg.dtype = "complex64"
    with pytest.raises(ValueError, match="dtype 'complex64'"):
        spec_from_proto(msg)
    msg = spec_to_proto(_spec())
    msg.collective = agent_pb2.COLLECTIVE_UNSPECIFIED
    with pytest.raises(ValueError, match="collective"):
        spec_from_proto(msg)
    msg = spec_to_proto(_spec())
    msg.sizes.step_factor = 1
    with pytest.raises(ValueError, match="step_factor"):
        spec_from_proto(msg)


def test_executor_rejects_what_it_cannot_run_without_starting_anything(tmp_path: Path) -> None:
    executor = BenchmarkExecutor(policy=EnvPolicy())
    run = spec_to_proto(_spec())
    sim = executor.execute(run, node_name="a", backend=Backend.SIM, deadline_s=10, work_dir=tmp_path)
    assert sim.status == agent_pb2.COMMAND_STATUS_REJECTED and "not run by this executor" in sim.message
    stranger = executor.execute(run, node_name="z", backend=Backend.GLOO, deadline_s=10, work_dir=tmp_path)
    assert stranger.status == agent_pb2.COMMAND_STATUS_REJECTED and "no rank on node z" in stranger.message
    run.iters = 0
    bad = executor.execute(run, node_name="a", backend=Backend.GLOO, deadline_s=10, work_dir=tmp_path)
    assert bad.status == agent_pb2.COMMAND_STATUS_REJECTED and "iters" in bad.message
    assert bad.HasField("finished_at")
    run.iters = 10
    run.cuda_graph = True
    graphed = executor.execute(run, node_name="a", backend=Backend.GLOO, deadline_s=10, work_dir=tmp_path)
    assert graphed.status == agent_pb2.COMMAND_STATUS_REJECTED
    assert graphed.message == "cuda_graph: CUDA graphs need the nccl backend; this node runs gloo"
    assert list(tmp_path.iterdir()) == []


def test_a_deadline_the_agent_cannot_keep_is_rejected_naming_the_field(tmp_path: Path) -> None:
    # deadline_s is a uint32 on the wire: a controller can send 49 days; the launcher could not wait that long.
    executor = BenchmarkExecutor(policy=EnvPolicy())
    run = spec_to_proto(_spec())
    far = executor.execute(run, node_name="a", backend=Backend.GLOO, deadline_s=4e9, work_dir=tmp_path)
    assert far.status == agent_pb2.COMMAND_STATUS_REJECTED
    assert far.message == f"deadline_s must be at most {MAX_DEADLINE_S} s, got 4000000000"
    probe = agent_pb2.Probe(
        probe_id="p", peers=["a", "b"], message_bytes=1 << 20, rendezvous_host="ha", peer_rendezvous_host="hb"
    )
    probe.rendezvous_port = 7000
    far = executor.probe(probe, node_name="a", backend=Backend.GLOO, deadline_s=4e9, work_dir=tmp_path)
    assert far.status == agent_pb2.COMMAND_STATUS_REJECTED and "deadline_s" in far.message
    assert list(tmp_path.iterdir()) == [], "nothing was started"


def test_a_probe_is_one_sendrecv_on_nccl_and_one_broadcast_each_way_on_gloo() -> None:
    probe = agent_pb2.Probe(
        probe_id="p",
        peers=["a", "b"],
        message_bytes=1 << 20,
        rendezvous_host="ha",
        peer_rendezvous_host="hb",
        rendezvous_port=7000,
    )
    (spec,) = probe_specs(probe, one_way=False)
    assert spec.collective is Collective.SENDRECV and spec.world_size == 2
    assert spec.sweep.sizes() == (8, 1 << 20)
    out, back = probe_specs(probe, one_way=True)
    # Each direction alone: the broadcast's root (rank 0, the rendezvous host) sends, the other receives.
    assert (out.collective, back.collective) == (Collective.BROADCAST, Collective.BROADCAST)
    assert [s.node_name for s in out.ranks] == ["a", "b"] and (out.rendezvous_host, out.rendezvous_port) == ("ha", 7000)
    assert [s.node_name for s in back.ranks] == ["b", "a"] and (back.rendezvous_host, back.rendezvous_port) == (
        "hb",
        7001,
    )
    assert out.job_id != back.job_id and out.sweep.sizes() == back.sweep.sizes() == (8, 1 << 20)
    with pytest.raises(ValueError, match="peers"):
        probe_specs(agent_pb2.Probe(probe_id="p", peers=["a"], message_bytes=1 << 20), one_way=False)
    with pytest.raises(ValueError, match="multiple of latency_bytes"):
        probe_specs(
            agent_pb2.Probe(probe_id="p", peers=["a", "b"], message_bytes=1000, latency_bytes=64), one_way=False
        )
    with pytest.raises(ValueError, match="peer_rendezvous_host"):
        probe_specs(agent_pb2.Probe(probe_id="p", peers=["a", "b"], message_bytes=1 << 20), one_way=True)


def test_worker_config_round_trips_with_its_fault_hook(tmp_path: Path) -> None:
    config = WorkerConfig(
        spec=_spec(),
        rank=1,
        device=-1,
        backend=Backend.GLOO,
        bind_address="127.0.0.1",
        rendezvous_timeout_s=30.0,
        progress_path=tmp_path / "p.jsonl",
        result_path=tmp_path / "r.json",
        stderr_path=tmp_path / "stderr.log",
        sys_path=("/x",),
        fault=WorkerFault(corrupt_rank=1),
        job_env={"NCCL_TUNER_CONFIG_FILE": "/x/t.csv"},
    )
    config.dump(tmp_path / "c.json")
    assert WorkerConfig.load(tmp_path / "c.json") == config
