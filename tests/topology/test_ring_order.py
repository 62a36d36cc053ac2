from __future__ import annotations

import random

import pytest

from topo_tune.errors import RingOrderError
from topo_tune.tuner.ring.instances import rack_instance
from topo_tune.tuner.ring.model import canonical_rotation, ring_metrics, upper_bound
from topo_tune.tuner.ring.optimizer import optimize_ring


def _brute_force(bw: list[list[float]], lat: list[list[float]]) -> tuple[float, float]:
    """(best bottleneck, least latency among those) over every ring through 0..n-1."""
    import itertools

    n = len(bw)
    best = (-1.0, float("inf"))
    for perm in itertools.permutations(range(1, n)):
        if perm[0] > perm[-1]:
            continue  # each ring once: the mirror image has the same edges
        order = (0, *perm)
        bottleneck = min(bw[order[i]][order[(i + 1) % n]] for i in range(n))
        total = sum(lat[order[i]][order[(i + 1) % n]] for i in range(n))
        if bottleneck > best[0] or (bottleneck == best[0] and total < best[1]):
            best = (bottleneck, total)
    return best


def _random_instance(rng: random.Random, n: int) -> tuple[list[list[float]], list[list[float]]]:
    bw = [[0.0] * n for _ in range(n)]
    lat = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            # Few distinct values, so many rings tie on the bottleneck and latency must break the tie.
            bw[i][j] = bw[j][i] = float(rng.choice([12, 25, 25, 50, 100, 100]))
            lat[i][j] = lat[j][i] = float(rng.randint(1, 20))
    return bw, lat


def test_exact_equals_brute_force_on_200_random_instances() -> None:
    rng = random.Random(20261129)
    for case in range(200):
        n = rng.choice([4, 5, 6, 7, 8, 8, 9]) if case % 20 else 9
        bw, lat = _random_instance(rng, n)
        ring = optimize_ring(bw, lat)
        assert ring.method == "exact" and sorted(ring.order) == list(range(n))
        assert (ring.bottleneck_gbps, ring.total_latency_us) == pytest.approx(_brute_force(bw, lat)), case
        assert ring_metrics(ring.order, bw, lat) == pytest.approx((ring.bottleneck_gbps, ring.total_latency_us))


def _crossings(order: tuple[int, ...], racks: list[str]) -> int:
    n = len(order)
    return sum(racks[order[i]] != racks[order[(i + 1) % n]] for i in range(n))


@pytest.mark.parametrize("n", [8, 12, 24, 64])
def test_two_racks_with_a_slow_spine_are_crossed_exactly_twice(n: int) -> None:
    inst = rack_instance(n, rack_size=n // 2, seed=n, spine_oversubscription=4.0, degraded_share=0.0)
    # A shuffled starting labelling so the answer is not the input order.
    ring = optimize_ring(inst.bandwidth, inst.latency, racks=inst.racks)
    assert ring.method == ("exact" if n <= 12 else "heuristic")
    assert _crossings(ring.order, inst.racks) == 2
    naive = list(range(0, n, 2)) + list(range(1, n, 2))  # a careless interleaving for comparison
    interleaved = [naive[i // 2] if i % 2 == 0 else naive[n // 2 + i // 2] for i in range(n)]
    assert ring.total_latency_us < ring_metrics(interleaved, inst.bandwidth, inst.latency)[1]


def test_heuristic_reaches_the_bound_on_rack_structured_instances() -> None:
    for seed in range(3):
        inst = rack_instance(128, rack_size=16, seed=seed, spine_oversubscription=2.0)
        ring = optimize_ring(inst.bandwidth, inst.latency, racks=inst.racks, seed=seed)
        assert sorted(ring.order) == list(range(128))
        assert ring.bottleneck_gbps >= 0.99 * upper_bound(inst.bandwidth, inst.racks)


def test_heuristic_matches_exact_on_small_instances_when_forced() -> None:
    rng = random.Random(3)
    for _ in range(20):
        bw, lat = _random_instance(rng, 9)
        exact = optimize_ring(bw, lat)
        heuristic = optimize_ring(bw, lat, exact_limit=3)
        assert heuristic.method == "heuristic"
        assert heuristic.bottleneck_gbps == exact.bottleneck_gbps


@pytest.mark.parametrize(
    ("bw", "lat", "message"),
    [
        ([[0, 1], [1]], None, "square"),
        ([[0, 1, 2], [1, 0, 3], [2, 4, 0]], None, r"bandwidth must be symmetric: \[1\]\[2\]"),
        ([[0, 1, 2], [1, 0, -3], [2, -3, 0]], None, r"bandwidth\[1\]\[2\] must be positive"),
        ([[0, 1], [1, 0]], [[0, 1, 1], [1, 0, 1], [1, 1, 0]], "latency must have"),
        ([[0, float("nan")], [float("nan"), 0]], None, r"bandwidth\[0\]\[1\] is not a finite"),
    ],
)
def test_bad_matrices_name_the_entry(bw: list[list[float]], lat: list[list[float]] | None, message: str) -> None:
    with pytest.raises(RingOrderError, match=message):
        optimize_ring(bw, lat)


def test_racks_must_label_every_member() -> None:
    with pytest.raises(RingOrderError, match="racks has 1 labels for 4 members"):
        optimize_ring([[0 if i == j else 1 for j in range(4)] for i in range(4)], racks=["a"])


def test_canonical_rotation() -> None:
    assert canonical_rotation((3, 1, 0, 2)) == (0, 1, 3, 2)
    assert canonical_rotation((2, 0, 1, 3)) == (0, 1, 3, 2)
