"""Sparse probe sampling: what it probes (coverage), how it escalates, what it infers and finds."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from topo_tune.topology.sampling import PairSampler, SamplingPolicy, default_mode, pair_rounds


def _racks(racks: int, size: int) -> dict[str, str]:
    return {f"r{r}n{i:02d}": f"rack-{r}" for r in range(racks) for i in range(size)}


def _run(sampler: PairSampler, figure) -> list[list[tuple[str, str]]]:  # type: ignore[no-untyped-def]
    batches = []
    while batch := sampler.next_pairs():
        batches.append(batch)
        for a, b in batch:
            sampler.record(a, b, figure(a, b), 3.0)
    return batches


def _healthy(rack_of: dict[str, str], *, slow_nodes=(), slow_racks=(), slow_pairs=()):  # type: ignore[no-untyped-def]
    def figure(a: str, b: str) -> float:
        rate = 400.0
        if rack_of[a] != rack_of[b]:
            rate = 200.0 if not {rack_of[a], rack_of[b]} & set(slow_racks) else 100.0
        if a in slow_nodes or b in slow_nodes:
            rate = min(rate, 200.0)
        if (a, b) in slow_pairs or (b, a) in slow_pairs:
            rate /= 4
        # A spread of about 1% that depends on the pair only.
        return rate * (1.0 - (hash((min(a, b), max(a, b))) % 100) / 10_000)

    return figure


def test_default_mode_is_sparse_above_64_nodes() -> None:
    assert default_mode(64) == "full"
    assert default_mode(65) == "sparse"


def test_every_node_is_in_two_intra_rack_pairs_and_every_rack_pair_is_sampled() -> None:
    rack_of = _racks(6, 8)
    sampler = PairSampler(rack_of, SamplingPolicy(inter_first=3))
    first = sampler.next_pairs()
    intra = Counter(n for a, b in first if rack_of[a] == rack_of[b] for n in (a, b))
    assert all(intra[n] == 2 for n in rack_of), "a ring inside each rack covers each node exactly twice"
    per_rack_pair = Counter(tuple(sorted((rack_of[a], rack_of[b]))) for a, b in first if rack_of[a] != rack_of[b])
    assert set(per_rack_pair) == set(itertools.combinations(sorted(set(rack_of.values())), 2))
    assert set(per_rack_pair.values()) == {3}
    # Far fewer than every pair: the point of sampling.
    assert len(first) < len(rack_of) * (len(rack_of) - 1) // 2 // 4


def test_intra_all_probes_every_intra_rack_pair() -> None:
    rack_of = _racks(3, 5)
    first = PairSampler(rack_of, SamplingPolicy(intra="all")).next_pairs()
    intra = {(a, b) for a, b in first if rack_of[a] == rack_of[b]}
    assert len(intra) == 3 * 10


def test_every_node_is_probed_twice_even_alone_in_its_rack() -> None:
    rack_of = {"a": "r1", "b": "r2", "c": "r2", "d": "r3", "e": "r3", "f": "r3"}
    sampler = PairSampler(rack_of, SamplingPolicy(inter_first=1))
    _run(sampler, lambda a, b: 100.0)
    degree = Counter(n for pair in sampler.planned for n in pair)
    assert min(degree[n] for n in rack_of) >= 2


def test_a_node_whose_probes_fail_gets_other_peers() -> None:
    rack_of = _racks(2, 6)
    sampler = PairSampler(rack_of, SamplingPolicy(inter_first=1))
    dead_end = "r0n00"
    first = sampler.next_pairs()
    for a, b in first:
        if dead_end in (a, b):
            sampler.failed(a, b)
        else:
            sampler.record(a, b, 100.0, 3.0)
    retry = sampler.next_pairs()
    assert sum(dead_end in pair for pair in retry) >= 2
    assert not set(retry) & set(first), "no pair is handed out twice"


def test_an_outlier_pair_escalates_to_its_neighbours_and_names_the_slow_nic() -> None:
    rack_of = _racks(4, 8)
    slow = "r2n05"
    sampler = PairSampler(rack_of, SamplingPolicy(escalate_peers=2))
    figure = _healthy(rack_of, slow_nodes={slow})
    first = sampler.next_pairs()
    for a, b in first:
        sampler.record(a, b, figure(a, b), 3.0)
    ring_peers = {b if a == slow else a for a, b in first if slow in (a, b) and rack_of[a] == rack_of[b]}
    second = sampler.next_pairs()
    # The slow node and each ring peer it slowed are probed with two more rack-mates.
    assert sum(slow in pair and rack_of[pair[0]] == rack_of[pair[1]] for pair in second) >= 2
    for peer in ring_peers:
        assert sum(peer in pair and slow not in pair for pair in second) >= 2
    for a, b in second:
        sampler.record(a, b, figure(a, b), 3.0)
    _run(sampler, figure)
    found = sampler.findings()
    assert found.degraded_nodes == (slow,)
    assert found.degraded_uplinks == ()
    assert found.outlier_pairs == ()


def test_without_an_outlier_nothing_escalates() -> None:
    rack_of = _racks(4, 8)
    sampler = PairSampler(rack_of, SamplingPolicy(inter_first=3))
    batches = _run(sampler, _healthy(rack_of))
    assert sum(len(b) for b in batches[1:]) == 0
    assert sampler.findings().degraded_nodes == ()


def test_a_slow_uplink_and_a_slow_cable_are_told_apart_from_slow_nics() -> None:
    rack_of = _racks(5, 8)
    sampler = PairSampler(rack_of)
    first = sampler.next_pairs()
    cable = next((a, b) for a, b in first if rack_of[a] == rack_of[b] == "rack-0")
    _run_rest = _healthy(rack_of, slow_racks={"rack-3"}, slow_pairs={cable})
    for a, b in first:
        sampler.record(a, b, _run_rest(a, b), 3.0)
    _run(sampler, _run_rest)
    found = sampler.findings()
    assert found.degraded_uplinks == ("rack-3",)
    assert found.degraded_nodes == ()
    assert found.outlier_pairs == (tuple(sorted(cable)),)


def test_the_spread_sizes_the_cross_rack_sample() -> None:
    rack_of = _racks(3, 10)
    policy = SamplingPolicy(inter_first=3, inter_max=10, rel_error=0.01)
    quiet, noisy = PairSampler(rack_of, policy), PairSampler(rack_of, policy)
    _run(quiet, lambda a, b: 200.0)
    wobble = iter(itertools.cycle([170.0, 200.0, 230.0, 185.0, 215.0]))
    _run(noisy, lambda a, b: next(wobble) if rack_of[a] != rack_of[b] else 400.0)

    def cross(s: PairSampler) -> int:
        return sum(rack_of[a] != rack_of[b] for a, b in s.planned)

    assert cross(quiet) == 3 * 3
    assert cross(noisy) == 3 * 10


def test_the_matrix_marks_inferred_pairs_and_infers_from_the_rack_model() -> None:
    rack_of = _racks(3, 6)
    slow = "r1n02"
    sampler = PairSampler(rack_of)
    _run(sampler, _healthy(rack_of, slow_nodes={slow}))
    m = sampler.matrix()
    assert m.measured_pairs == len(sampler.planned)
    measured = {tuple(sorted(p)) for p in sampler.planned}
    for a, b in itertools.combinations(m.names, 2):
        assert m.source(a, b) == ("measured" if (a, b) in measured else "inferred")
    i = {n: k for k, n in enumerate(m.names)}
    unmeasured_intra = next(
        (a, b)
        for a, b in itertools.combinations(m.names, 2)
        if (a, b) not in measured and rack_of[a] == rack_of[b] and slow not in (a, b)
    )
    assert m.bandwidth[i[unmeasured_intra[0]], i[unmeasured_intra[1]]] == pytest.approx(400, rel=0.02)
    slow_peer = next(
        b for b in m.names if rack_of[b] == rack_of[slow] and b != slow and (min(slow, b), max(slow, b)) not in measured
    )
    assert m.bandwidth[i[slow], i[slow_peer]] == pytest.approx(200, rel=0.02), "a slow NIC caps what is inferred"
    cross = next(
        (a, b) for a, b in itertools.combinations(m.names, 2) if (a, b) not in measured and rack_of[a] != rack_of[b]
    )
    assert m.bandwidth[i[cross[0]], i[cross[1]]] == pytest.approx(200, rel=0.02)
    assert np.allclose(m.bandwidth, m.bandwidth.T)
    pm = m.to_pair_matrix()
    assert pm.get(*cross).source == "inferred"
    assert pm.get(*next(iter(measured))).source == "measured"


def test_pair_rounds_are_disjoint_and_keep_every_pair() -> None:
    rack_of = _racks(8, 8)
    pairs = PairSampler(rack_of).next_pairs()
    rounds = pair_rounds(pairs)
    assert sorted(p for r in rounds for p in r) == sorted(pairs)
    for r in rounds:
        nodes = [n for p in r for n in p]
        assert len(nodes) == len(set(nodes))
    degree = Counter(n for p in pairs for n in p)
    assert len(rounds) <= 2 * max(degree.values()) - 1


def test_bad_input_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="inter_first"):
        SamplingPolicy(inter_first=0)
    with pytest.raises(ValueError, match="outlier"):
        SamplingPolicy(outlier=1.5)
    sampler = PairSampler(_racks(2, 2))
    sampler.next_pairs()
    with pytest.raises(KeyError, match="not planned"):
        sampler.record("r0n00", "nope", 1.0, 1.0)
    a, b = sorted(sampler.planned)[0]
    with pytest.raises(ValueError, match="bandwidth"):
        sampler.record(a, b, float("nan"), 1.0)


def test_a_planned_ring_has_its_unprobed_edges_measured() -> None:
    rack_of = _racks(3, 6)
    sampler = PairSampler(rack_of)
    _run(sampler, _healthy(rack_of))
    order = sorted(rack_of)
    new = sampler.ring_pairs(order)
    edges = {tuple(sorted((order[i], order[(i + 1) % len(order)]))) for i in range(len(order))}
    assert new and set(new) <= edges
    assert edges <= sampler.planned
    assert sampler.ring_pairs(order) == [], "each edge is handed out once"
    with pytest.raises(KeyError, match="not sampled"):
        sampler.ring_pairs(["r0n00", "elsewhere", "r1n00"])


def test_a_slow_uplink_is_not_escalated_pair_by_pair() -> None:
    # Every cross-rack pair of a slow rack is an outlier; once the rack's uplink explains them, its pairs are
    # not each escalated (that would probe the slow rack against the whole cluster).
    rack_of = _racks(10, 8)
    healthy, slow = PairSampler(rack_of), PairSampler(rack_of)
    _run(healthy, _healthy(rack_of))
    _run(slow, _healthy(rack_of, slow_racks={"rack-4"}))
    assert slow.findings().degraded_uplinks == ("rack-4",)
    assert len(slow.planned) <= len(healthy.planned) + 2 * 8
