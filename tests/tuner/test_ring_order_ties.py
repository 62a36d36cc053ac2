"""The exact ring optimizer on pair matrices where many rings tie on the bottleneck: the spine is crossed least."""

from __future__ import annotations

import itertools

import pytest

from topo_tune.tuner.ring.model import rack_crossings, ring_metrics
from topo_tune.tuner.ring.optimizer import optimize_ring

INTRA_GBPS = 400.0
SPINE_GBPS = 400.0 / 3  # a 3:1 spine as a pair matrix sees it: every cross-rack pair alone gets a third


def _two_racks(
    interleaved: list[str], *, latency_us: tuple[float, float] | None
) -> tuple[list[list[float]], list[list[float]] | None]:
    """Each pair on its own, as a node-pair matrix models it: the spine's sharing between pairs is invisible."""
    n = len(interleaved)
    bw = [[INTRA_GBPS if interleaved[i] == interleaved[j] else SPINE_GBPS for j in range(n)] for i in range(n)]
    if latency_us is None:
        return bw, None
    inside, across = latency_us
    lat = [
        [0.0 if i == j else inside if interleaved[i] == interleaved[j] else across for j in range(n)] for i in range(n)
    ]
    return bw, lat


@pytest.mark.parametrize("latency_us", [None, (2.0, 2.0), (2.0, 1.9)], ids=["no-latency", "flat", "spine-looks-faster"])
def test_a_bottleneck_tie_is_broken_by_fewest_rack_crossings(latency_us: tuple[float, float] | None) -> None:
    # Hosts alternate racks (node-01 in a, node-02 in b, ...). Every ring through 8 nodes of 2 racks crosses the
    # spine, so every ring's bottleneck is the spine's third: the bottleneck alone cannot choose. Without racks
    # the optimizer is free to cross 4, 6 or 8 times, each crossing another flow on the shared uplinks; with a
    # measured latency that makes the spine look a hair faster (noise), latency alone would even prefer that.
    racks = ["a", "b"] * 4
    bw, lat = _two_racks(racks, latency_us=latency_us)
    ring = optimize_ring(bw, lat, racks=racks)
    assert ring.method == "exact"
    assert ring.bottleneck_gbps == pytest.approx(SPINE_GBPS)
    assert rack_crossings(ring.order, racks) == 2, ring.order
    # Among the two-crossing rings, the least latency: here every two-crossing ring costs the same.
    best_latency = min(
        ring_metrics((0, *perm), bw, lat)[1]
        for perm in itertools.permutations(range(1, 8))
        if rack_crossings((0, *perm), racks) == 2
    )
    assert ring.total_latency_us == pytest.approx(best_latency)


def test_without_racks_the_tie_is_broken_by_latency_alone() -> None:
    # The rack labels are what lets the optimizer see crossings: without them, latency decides as before.
    racks = ["a", "b"] * 4
    bw, lat = _two_racks(racks, latency_us=(2.0, 1.9))
    ring = optimize_ring(bw, lat)
    assert rack_crossings(ring.order, racks) == 8  # every edge on the (seemingly) faster spine
    assert ring.total_latency_us == pytest.approx(8 * 1.9)


def test_crossings_never_outrank_the_bottleneck() -> None:
    # One rack pair is fast across the spine: a ring with more crossings but a better bottleneck still wins.
    racks = ["a", "a", "b", "b"]
    bw = [
        [0.0, 10.0, 100.0, 100.0],
        [10.0, 0.0, 100.0, 100.0],
        [100.0, 100.0, 0.0, 10.0],
        [100.0, 100.0, 10.0, 0.0],
    ]
    ring = optimize_ring(bw, None, racks=racks, exact_limit=4)
    assert ring.bottleneck_gbps == pytest.approx(100.0)
    assert rack_crossings(ring.order, racks) == 4


def test_rack_crossings_counts_the_closing_edge() -> None:
    assert rack_crossings((0, 1, 2, 3), ["a", "a", "b", "b"]) == 2
    assert rack_crossings((0, 2, 1, 3), ["a", "a", "b", "b"]) == 4
    assert rack_crossings((0,), ["a"]) == 0
