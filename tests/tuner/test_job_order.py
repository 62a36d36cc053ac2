"""A job's node order from its version's rank map: deterministic, a permutation, never worse than the launcher's
order on the matrix, re-planned for a subset, unknown nodes after the known ones, one node."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from topo_tune.errors import ValidationError
from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.ring.instances import rack_instance
from topo_tune.tuner.ring.job_order import job_order, pinned_order, read_rank_map
from topo_tune.tuner.ring.model import ring_metrics
from topo_tune.tuner.ring.rank_map import RankMap, RingPrediction, plan_rank_map
from topo_tune.versions.version import ConfigVersion


def rank_map_of(names: list[str], bandwidth: list[list[float]], order: list[str] | None = None) -> str:
    """A version's rankmap.json over ``names``; its ring is ``order`` (default: the optimizer's)."""
    latency = [[0.0 if i == j else 3.0 for j in range(len(names))] for i in range(len(names))]
    pairs = PairMatrix.from_matrices(names, bandwidth, latency, method="test")
    if order is None:
        return plan_rank_map(pairs, slots=1).to_json()
    ring = RingPrediction(tuple(order), 0.0, 0.0)
    return RankMap(planned=ring, naive=ring, slots=dict.fromkeys(names, 1), method="test", pairs=pairs).to_json()


def random_cluster(n: int, seed: int) -> tuple[list[str], list[list[float]]]:
    instance = rack_instance(n, rack_size=4, seed=seed, spine_oversubscription=4.0, degraded_share=0.1)
    return [f"gpu{i:02d}" for i in range(n)], instance.bandwidth


def bottleneck(names: list[str], bandwidth: list[list[float]], order: tuple[str, ...] | list[str]) -> float:
    index = {n: i for i, n in enumerate(names)}
    return ring_metrics([index[n] for n in order], bandwidth)[0]


# p..u: the version's ring p-q-r-s-t-u is fast everywhere; of the job's nodes {p, r, s, u}, the pairs the
# dropped ring joins (p-r, s-u) are slow, while p-u-r-s is fast.
SIX = ["p", "q", "r", "s", "t", "u"]
FAST = {("p", "q"), ("q", "r"), ("r", "s"), ("s", "t"), ("t", "u"), ("p", "u"), ("r", "u"), ("p", "s")}
SIX_BW = [[100.0 if (a, b) in FAST or (b, a) in FAST else 10.0 for b in SIX] for a in SIX]
SIX_MAP = rank_map_of(SIX, SIX_BW, order=SIX)


def test_a_subset_is_re_planned_where_dropping_nodes_would_join_slow_pairs() -> None:
    got = job_order(SIX_MAP, ["u", "s", "r", "p"])
    assert bottleneck(SIX, SIX_BW, [n for n in SIX if n in got.order]) == 10.0, "dropping joins p-r and s-u"
    assert got.method == "replanned"
    assert got.bottleneck_gbps == 100.0 and got.given_bottleneck_gbps == 10.0
    assert got.order == ("p", "s", "r", "u"), "started at the first name, turned canonically"


def test_the_order_is_the_same_however_the_nodes_are_listed() -> None:
    names, bandwidth = random_cluster(16, seed=3)
    rank_map = rank_map_of(names, bandwidth)
    rng = random.Random(0)
    for subset in (names[2:9], names[1:15]):  # exact (7 nodes) and heuristic (14 nodes)
        first = job_order(rank_map, subset)
        for _ in range(4):
            listed = list(subset) + rng.sample(subset, 2)  # shuffled, with repeats
            rng.shuffle(listed)
            assert job_order(rank_map, listed) == first


def test_the_order_is_a_permutation_of_the_jobs_nodes() -> None:
    names, bandwidth = random_cluster(12, seed=5)
    rank_map = rank_map_of(names, bandwidth)
    for size in range(1, 13):
        subset = random.Random(size).sample(names, size)
        assert sorted(job_order(rank_map, subset + subset[:1]).order) == sorted(subset)


@pytest.mark.parametrize("seed", range(6))
def test_the_order_is_never_worse_than_the_launchers_order_on_the_matrix(seed: int) -> None:
    names, bandwidth = random_cluster(14, seed=seed)
    rank_map = rank_map_of(names, bandwidth)
    rng = random.Random(seed)
    for size in (3, 5, 7, 14):
        subset = rng.sample(names, size)
        got = job_order(rank_map, subset)
        assert got.bottleneck_gbps == pytest.approx(bottleneck(names, bandwidth, got.order))
        assert got.bottleneck_gbps >= bottleneck(names, bandwidth, sorted(subset)) - 1e-9, "the launcher's order"
        if size <= 7:  # exact: not worse than any order the launcher could have used
            best_any = max(bottleneck(names, bandwidth, (subset[0], *p)) for p in itertools.permutations(subset[1:]))
            assert got.bottleneck_gbps == pytest.approx(best_any)


def test_the_launchers_order_is_kept_when_the_tuned_ring_is_not_better() -> None:
    names = ["a", "b", "c", "d"]
    uniform = [[50.0] * 4 for _ in names]
    got = job_order(rank_map_of(names, uniform, order=["a", "c", "b", "d"]), ["d", "c", "a"])
    assert got.method == "given" and got.order == ("a", "c", "d"), "equal on the matrix: no reason to move ranks"
    assert got.bottleneck_gbps == got.given_bottleneck_gbps == 50.0


def test_the_whole_version_gets_the_versions_own_ring() -> None:
    names, bandwidth = random_cluster(8, seed=1)
    rank_map = rank_map_of(names, bandwidth)
    planned = tuple(json.loads(rank_map)["planned"]["node_order"])
    got = job_order(rank_map, list(reversed(names)))
    assert (got.order, got.method) == (planned, "version"), "what the study measured, as it measured it"


def test_unknown_nodes_follow_the_known_ones_in_the_launchers_order_with_a_warning() -> None:
    got = job_order(SIX_MAP, ["zz", "u", "new1", "s", "r", "p"])
    assert got.order[:4] == ("p", "s", "r", "u") and got.order[4:] == ("new1", "zz")
    assert got.bottleneck_gbps is None and got.given_bottleneck_gbps is None, "their links were never seen"
    assert len(got.warnings) == 1 and "2 node(s) not in the version's pair matrix (new1, zz)" in got.warnings[0]


def test_a_job_of_one_node_has_no_ring() -> None:
    got = job_order(SIX_MAP, ["q"])
    assert (got.order, got.method, got.bottleneck_gbps) == (("q",), "single", math.inf)
    assert job_order(None, ["q", "q"]).order == ("q",)


def test_without_a_rank_map_the_job_keeps_the_launchers_order() -> None:
    assert job_order(None, ["b", "a"], version="").order == ("a", "b")
    assert job_order(None, ["b", "a"], version="").method == "defaults"
    assert job_order(None, ["b", "a"], version="cv-0123456789abcdef").method == "natural"
    with pytest.raises(ValidationError, match="nodes"):
        job_order(None, [])


def test_a_rank_map_without_a_matrix_drops_the_other_nodes_and_says_it_cannot_predict() -> None:
    old = json.dumps({"planned": {"node_order": ["c", "a", "d", "b"]}})
    got = job_order(old, ["a", "b", "c"])
    assert got.order == ("c", "a", "b") and got.method == "dropped" and got.bottleneck_gbps is None
    assert "no pair matrix" in got.warnings[0]
    assert job_order(old, ["d", "c", "b", "a"]).order == ("c", "a", "d", "b"), "the whole set: the version's ring"


def test_a_pinned_order_is_predicted_as_it_stands() -> None:
    pinned = pinned_order(SIX_MAP, ["p", "r", "s", "u"])
    assert (pinned.method, pinned.bottleneck_gbps, pinned.given_bottleneck_gbps) == ("pinned", 10.0, 10.0)


def test_the_matrix_is_carried_and_read_back() -> None:
    ring = read_rank_map(SIX_MAP)
    assert ring.names == tuple(SIX) and ring.bandwidth is not None
    assert ring.bandwidth[0][1] == 100.0 and ring.bandwidth[1][0] == 100.0 and ring.bandwidth[0][2] == 10.0
    assert ring.measured_edges(["p", "q", "r"]) == (0, 3), "given pairs are not measured ones"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[]", "rankmap.json"),
        ('{"planned": {}}', "planned.node_order"),
        ('{"planned": {"node_order": ["a", "b"]}, "pair_matrix": {"nodes": ["b", "a"]}}', "pair_matrix.nodes"),
        (
            '{"planned": {"node_order": ["a", "b"]}, "pair_matrix": {"nodes": ["a", "b"], '
            '"bandwidth_gbps": [[1, 2]], "latency_us": [[0]]}}',
            "bandwidth_gbps[0]",
        ),
    ],
)
def test_a_malformed_rank_map_names_its_field(text: str, field: str) -> None:
    for nodes in (["a", "b"], ["a"]):  # a job of one node too: the map is refused, not skipped
        with pytest.raises(ValidationError, match=field.replace("[", r"\[").replace("]", r"\]")):
            job_order(text, nodes)


def test_a_version_refuses_a_malformed_pair_matrix_before_anything_stores_it() -> None:
    data = json.loads(SIX_MAP)
    data["pair_matrix"]["latency_us"][0] = [1.0]
    with pytest.raises(ValidationError, match=r"pair_matrix\.latency_us\[0\]"):
        ConfigVersion({"rankmap.json": json.dumps(data)})
    assert ConfigVersion({"rankmap.json": SIX_MAP}).files["rankmap.json"] == SIX_MAP, "the tuner's own is fine"
