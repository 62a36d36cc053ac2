"""The sim backend applies a job's candidate tuner table per size, as the plugin does inside NCCL."""

from __future__ import annotations

import pytest

from topo_tune.agent.sim_backend import run_simulated
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, plan_job
from topo_tune.nccl.collectives import Collective
from topo_tune.sim import simulate
from topo_tune.sim.node_topology import simulated_node_topology
from topo_tune.sim.topology_import import cluster_from_topologies
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import spec_to_proto

NODES = ("a", "b")
SWEEP = SizeSweep(4096, 1 << 30, 16)  # 4K 64K 1M 16M 256M
LARGE = 16 << 20


def _times(table: str = "", env: dict[str, str] | None = None) -> dict[int, float]:
    return {s.bytes: s.time_us for s in _sizes(table, env)}


def _sizes(table: str = "", env: dict[str, str] | None = None) -> list[agent_pb2.SizeResult]:
    spec = plan_job(
        job_id="sim-table",
        collective=Collective.ALL_REDUCE,
        sweep=SWEEP,
        dtype=dtype_named("float32"),
        nodes=[JobNode(n, n, 8) for n in NODES],
        rendezvous_port=29500,
        env=env or {},
        gpu_devices=False,
        placements=(False,),
        tuner_table=table,
    )
    run = spec_to_proto(spec)
    run.sim.nodes.extend(simulated_node_topology(n) for n in NODES)
    run.sim.rack_of.update(dict.fromkeys(NODES, "r1"))
    run.sim.seed = 7
    result = run_simulated(run, node_name="a", policy=EnvPolicy(), now_ns=0)
    assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, result.message
    return list(result.node_benchmark.ranks[0].sizes)


_MODEL_ALGO = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS", "nvls_tree": "NVLSTree"}
_MODEL_PROTO = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}


def test_rows_change_exactly_the_sizes_they_match() -> None:
    plain = _times()
    # Two channels above 16 MiB, for this communicator (2 nodes x 8 ranks) only.
    tabled = _times("allreduce,16777217,4294967296,-1,-1,2,2,16\nallreduce,0,65536,-1,-1,2,4,32\n")
    # NCCL picks before it applies a plugin's count: two channels on the pick it makes without the row.
    (large,) = [s for s in _sizes() if s.bytes > LARGE]
    algorithm, protocol = large.choice.nccl.split("/")
    pick = {"NCCL_ALGO": _MODEL_ALGO[algorithm], "NCCL_PROTO": _MODEL_PROTO[protocol]}
    # The model run directly (a job may not force LL128 through NCCL_PROTO), with the job's seed and ladder.
    cluster = cluster_from_topologies([simulated_node_topology(n) for n in NODES], racks=dict.fromkeys(NODES, "r1"))
    env = {"NCCL_MIN_CTAS": "2", "NCCL_MAX_CTAS": "2", **pick}
    direct = simulate(cluster, collective="all_reduce", sizes=SWEEP.sizes(), env=env, rank_order=NODES, seed=7)
    forced = {size: s.time_us for size, s in zip(plain, direct.sizes, strict=True)}

    for size in plain:
        if size > LARGE:
            assert tabled[size] == forced[size] > 1.5 * plain[size], "the row's channel count applies"
        else:
            assert tabled[size] == plain[size], "sizes no row matches keep NCCL's choice and the same noise draw"


def test_a_row_the_model_cannot_run_is_passed_over_for_the_next() -> None:
    # CollNet needs hardware the model has none of: like NCCL's -1 entry, the row is skipped.
    tabled = _times("allreduce,0,65536,collnet_direct,simple,4,-1,-1\nallreduce,0,65536,-1,-1,1,-1,-1\n")
    one_channel = _times(env={"NCCL_MIN_CTAS": "1", "NCCL_MAX_CTAS": "1"})
    plain = _times()
    assert tabled[4096] == one_channel[4096]
    assert tabled[65536] == one_channel[65536]
    assert tabled[1 << 20] == plain[1 << 20]


def test_a_malformed_table_is_refused() -> None:
    with pytest.raises(ValueError, match="tuner_table line 1: channels '0'"):
        _times("allreduce,0,65536,ring,ll,0,-1,-1\n")


def test_every_size_reports_what_nccl_offered_chose_and_ran() -> None:
    # Two NVSwitch nodes: ring and tree with the three protocols (NVLink carries the ring, so LL128 is allowed),
    # and NVLS inside the node with a tree between them (Simple only).
    offered = ["tree/ll", "tree/ll128", "tree/simple", "ring/ll", "ring/ll128", "ring/simple", "nvls_tree/simple"]
    plain = _sizes()
    assert all(sorted(s.choice.offered) == sorted(offered) for s in plain)
    assert all(s.choice.applied == s.choice.nccl and s.choice.channels == 0 for s in plain), "no table: NCCL's"
    assert plain[0].choice.nccl == "tree/ll" and plain[-1].choice.nccl.startswith("ring/"), "latency, then bandwidth"

    tabled = _sizes("allreduce,16777217,4294967296,tree,ll,2,-1,-1\n")
    for before, after in zip(plain, tabled, strict=True):
        assert after.choice.nccl == before.choice.nccl, "NCCL's own pick is reported, table or not"
        if before.bytes > LARGE:
            assert (after.choice.applied, after.choice.channels) == ("tree/ll", 2)
        else:
            assert after.choice == before.choice


def test_a_row_naming_an_entry_nccl_does_not_offer_is_passed_over() -> None:
    # NCCL_PROTO=^LL128 takes LL128 out of NCCL's table: a row asking for it must not revive it.
    env = {"NCCL_PROTO": "LL,Simple"}
    tabled = _sizes("allreduce,0,4294967296,ring,ll128,-1,-1,-1\n", env)
    plain = _sizes(env=env)
    assert all("ring/ll128" not in s.choice.offered for s in plain)
    assert [s.time_us for s in tabled] == [s.time_us for s in plain]
    assert all(s.choice.applied == s.choice.nccl for s in tabled)
