from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

import pytest

from topo_tune.topology.distance import Measurement, node_pair_matrix
from topo_tune.topology.sampling import PairSampler, SamplingPolicy
from topo_tune.tuner.ring.rank_map import plan_rank_map


def _pairs() -> tuple[list[str], dict[str, str]]:
    # Hostnames sorted alphabetically interleave the two racks: the naive hostfile crosses the spine 4 times.
    names = ["node-a1", "node-b1", "node-a2", "node-b2", "node-a3", "node-b3"]
    rack_of = {n: n[5] for n in names}
    return names, rack_of


def test_rank_map_orders_nodes_rack_by_rack_and_reports_both_rings() -> None:
    names, rack_of = _pairs()
    pairs = node_pair_matrix(
        names, injection_gbps=dict.fromkeys(names, 400.0), rack_of=rack_of, spine_oversubscription=4.0
    )
    plan = plan_rank_map(pairs, slots=8, rack_of=rack_of)
    order = plan.planned.order
    assert order[0] == "node-a1", "rank 0 stays on the naive order's first node"
    racks = [rack_of[n] for n in order]
    assert sum(racks[i] != racks[(i + 1) % 6] for i in range(6)) == 2
    assert plan.planned.total_latency_us < plan.naive.total_latency_us
    assert plan.naive.order == tuple(names)
    data = json.loads(plan.to_json())
    assert data["world_size"] == 48 and data["version"] == 1
    assert data["planned"]["node_order"] == list(order)
    assert data["naive"]["ring_bottleneck_gbps"] == pytest.approx(plan.naive.bottleneck_gbps)
    assert data["ranks"][8] == {"rank": 8, "node": order[1], "local_rank": 0}


def test_hostfiles_for_mpi_slurm_and_torchrun() -> None:
    names, rack_of = _pairs()
    pairs = node_pair_matrix(names, injection_gbps=dict.fromkeys(names, 400.0), rack_of=rack_of)
    plan = plan_rank_map(pairs, slots={n: 2 for n in names}, rack_of=rack_of)
    order = plan.planned.order
    mpi = plan.hostfile("mpi").splitlines()
    edges = len(names)
    assert mpi[0] == (
        "# topo-tune ring order: predicted bottleneck 400.00 GB/s (naive order 400.00 GB/s; "
        f"ring edges: {edges} modelled)"
    ), "a prediction from modelled pairs says so"
    assert mpi[1] == f"# mpirun --mca rmaps seq --hostfile THIS_FILE -np {2 * edges}: one line per rank, in rank order"
    assert mpi[2:] == [n for n in order for _ in range(2)], "Open MPI's sequential mapper: one line per rank"
    assert plan.hostfile("slurm").splitlines()[1:] == [n for n in order for _ in range(2)]
    assert plan.hostfile("torchrun").splitlines()[1:] == [f"{n} {i}" for i, n in enumerate(order)]
    with pytest.raises(ValueError, match="flavour"):
        plan.hostfile("pbs")  # type: ignore[arg-type]


def test_rank_map_input_errors() -> None:
    names, rack_of = _pairs()
    pairs = node_pair_matrix(names, injection_gbps={}, rack_of=rack_of)
    with pytest.raises(ValueError, match="node-b3"):
        plan_rank_map(pairs, slots={n: 1 for n in names[:-1]})
    with pytest.raises(ValueError, match="naive_order"):
        plan_rank_map(pairs, slots=1, naive_order=names[:3])


def test_a_single_node_has_no_ring_and_still_valid_json() -> None:
    pairs = node_pair_matrix(["solo"], injection_gbps={}, rack_of={})
    plan = plan_rank_map(pairs, slots=4)
    data = json.loads(plan.to_json())
    assert data["planned"]["ring_bottleneck_gbps"] is None
    assert [r["local_rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert plan.hostfile("mpi").splitlines() == [
        "# topo-tune ring order: one node, no inter-node ring",
        "# mpirun --mca rmaps seq --hostfile THIS_FILE -np 4: one line per rank, in rank order",
        *["solo"] * 4,
    ]


def test_rank_map_marks_ring_edges_inferred_by_sparse_probing() -> None:
    rack_of = {f"{rack}{i}": rack for rack in "ab" for i in range(5)}
    sampler = PairSampler(rack_of, SamplingPolicy(inter_first=1, inter_max=1))
    while batch := sampler.next_pairs():
        for a, b in batch:
            sampler.record(a, b, 100.0 if rack_of[a] == rack_of[b] else 50.0, 3.0)
    pairs = sampler.matrix().to_pair_matrix()
    data = json.loads(plan_rank_map(pairs, slots=1, rack_of=rack_of).to_json())
    measured = {tuple(sorted(p)) for p in sampler.planned}
    assert data["pairs"] == {"inferred": 45 - len(measured), "measured": len(measured)}
    edges = data["planned"]["edges"]
    assert len(edges) == 10
    for edge in edges:
        pair = tuple(sorted((edge["node_a"], edge["node_b"])))
        assert edge["source"] == ("measured" if pair in measured else "inferred")
    assert {e["source"] for e in edges} == {"measured", "inferred"}


def test_the_hostfile_head_says_how_many_ring_edges_were_measured() -> None:
    names, rack_of = _pairs()
    pairs = node_pair_matrix(names, injection_gbps=dict.fromkeys(names, 400.0), rack_of=rack_of)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    for a, b in itertools.combinations(names, 2):
        pairs = pairs.with_measurement(a, b, Measurement(400.0, 5.0, when, "sendrecv"))
    plan = plan_rank_map(pairs, slots=dict.fromkeys(names, 2), rack_of=rack_of)
    assert plan.hostfile("mpi").splitlines()[0].endswith("; ring edges: 6 measured)")
    # Measure the pairs inside each rack at their modelled figures: the plan stays rack by rack, with two
    # spine-crossing edges left modelled.
    partial = node_pair_matrix(names, injection_gbps=dict.fromkeys(names, 400.0), rack_of=rack_of)
    for a, b in itertools.combinations(names, 2):
        if rack_of[a] == rack_of[b]:
            model = partial.get(a, b)
            partial = partial.with_measurement(a, b, Measurement(model.bandwidth_gbps, model.latency_us, when, "x"))
    partly = plan_rank_map(partial, slots=dict.fromkeys(names, 2), rack_of=rack_of)
    head = partly.hostfile("mpi").splitlines()[0]
    assert head.endswith("; ring edges: 4 measured, 2 modelled)"), head
