"""Rings over racks grouped in blocks (spine blocks, EKS layers, GKE blocks): each block's nodes stay together, so a
ring over two blocks crosses between them exactly twice, exact and heuristic, planned, modelled and re-planned."""

from __future__ import annotations

import json

import pytest

from topo_tune.errors import RingOrderError
from topo_tune.topology.distance import PairMatrix, node_pair_matrix
from topo_tune.tuner.ring.job_order import job_order
from topo_tune.tuner.ring.model import crossing_matrix, rack_crossings
from topo_tune.tuner.ring.optimizer import optimize_ring
from topo_tune.tuner.ring.rank_map import plan_rank_map


def blocks(racks: int, per_rack: int) -> tuple[list[str], list[str], list[list[str]]]:
    """Members of ``racks`` racks; odd racks in block A, even ones in B, so rack names interleave the blocks."""
    rack = [f"rack-{r}" for r in range(1, racks + 1) for _ in range(per_rack)]
    block = ["A" if int(r.split("-")[1]) % 2 else "B" for r in rack]
    return rack, block, [["spine-1", b] for b in block]


def flat(rack: list[str], *, across_blocks_us: float) -> tuple[list[list[float]], list[list[float]]]:
    """Every pair alone at one rate (the bottleneck ties everywhere); latency 2 µs, ``across_blocks_us`` between
    blocks (1.9: the noise of a measurement makes the block boundary look a hair faster)."""
    n = len(rack)
    block = [int(r.split("-")[1]) % 2 for r in rack]
    bw = [[100.0 if rack[i] == rack[j] else 50.0 for j in range(n)] for i in range(n)]
    lat = [[0.0 if i == j else 2.0 if block[i] == block[j] else across_blocks_us for j in range(n)] for i in range(n)]
    return bw, lat


def test_the_exact_ring_crosses_between_blocks_twice_even_where_latency_prefers_more() -> None:
    rack, block, tiers = blocks(racks=4, per_rack=2)
    bw, lat = flat(rack, across_blocks_us=1.9)
    ring = optimize_ring(bw, lat, racks=rack, tiers=tiers)
    assert ring.method == "exact"
    assert rack_crossings(ring.order, block) == 2, ring.order
    assert rack_crossings(ring.order, rack) == 4, "and each rack's nodes together within their block"
    racks_only = optimize_ring(bw, lat, racks=rack)
    assert rack_crossings(racks_only.order, block) == 4, "racks alone: latency picks the block boundary"


def test_the_heuristic_visits_each_block_once() -> None:
    rack, block, tiers = blocks(racks=8, per_rack=4)
    bw, lat = flat(rack, across_blocks_us=2.0)
    ring = optimize_ring(bw, lat, racks=rack, tiers=tiers)
    assert ring.method == "heuristic"
    assert rack_crossings(ring.order, block) == 2, ring.order
    assert rack_crossings(ring.order, rack) == 8
    assert rack_crossings(optimize_ring(bw, lat, racks=rack).order, block) > 2, "racks alone interleave the blocks"


def test_a_higher_tier_outweighs_every_crossing_below_it() -> None:
    weights = crossing_matrix(["r1", "r2", "r3"], 3, [["s1", "b1"], ["s1", "b1"], ["s1", "b2"]])
    assert weights.tolist() == [[0, 1, 5], [1, 0, 5], [5, 5, 0]], "(n + 1) per block boundary, + 1 for the rack"
    with pytest.raises(RingOrderError, match="tiers has 1 entries for 4 members"):
        optimize_ring([[1.0] * 4] * 4, tiers=[["b1"]])


def modelled(racks: int, per_rack: int) -> tuple[list[str], PairMatrix, dict[str, str], dict[str, tuple[str, ...]]]:
    rack, _, tiers = blocks(racks, per_rack)
    names = [f"node-{i:02d}" for i in range(len(rack))]
    rack_of = dict(zip(names, rack, strict=True))
    tiers_of = {n: tuple(t) for n, t in zip(names, tiers, strict=True)}
    pairs = node_pair_matrix(
        names, injection_gbps=dict.fromkeys(names, 50.0), rack_of=rack_of, tiers_of=tiers_of, spine_oversubscription=2
    )
    return names, pairs, rack_of, tiers_of


def test_the_model_climbs_one_tier_more_between_blocks() -> None:
    _, pairs, _, _ = modelled(racks=4, per_rack=2)
    same_rack, same_block, other_block = (pairs.get("node-00", b) for b in ("node-01", "node-04", "node-02"))
    assert (same_rack.hops, same_block.hops, other_block.hops) == (2, 4, 6)
    assert same_rack.latency_us < same_block.latency_us < other_block.latency_us
    assert same_block.bandwidth_gbps == other_block.bandwidth_gbps == 25.0, "no rate is guessed for the tier"


@pytest.mark.parametrize("racks", [4, 12], ids=["exact", "heuristic"])
def test_a_planned_rank_map_keeps_blocks_together_and_a_job_re_planned_from_it_too(racks: int) -> None:
    names, pairs, rack_of, tiers_of = modelled(racks, per_rack=2)
    block = {n: t[-1] for n, t in tiers_of.items()}
    planned = plan_rank_map(pairs, slots=8, rack_of=rack_of, tiers_of=tiers_of)
    order = planned.planned.order
    assert rack_crossings(range(len(order)), [block[n] for n in order]) == 2, order
    text = planned.to_json()
    assert json.loads(text)["pair_matrix"]["tiers"][0] == ["spine-1", "A"], "the rank map carries the tiers"
    job = [n for i, n in enumerate(names) if i % 4 != 3]  # part of each rack
    got = job_order(text, job)
    assert got.method in {"replanned", "dropped"}
    assert rack_crossings(range(len(got.order)), [block[n] for n in got.order]) == 2, got.order
