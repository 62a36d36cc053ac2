"""Rollout plans: canary first, then racks in natural order (grouped by the network tiers above them), K at a time;
deterministic and rendered."""

from __future__ import annotations

import pytest

from topo_tune.controller.rollout.plan import NO_RACK, PlanPolicy, WaveKind, build_plan
from topo_tune.errors import ValidationError
from topo_tune.kube.rack import placement, tiers_above


def cluster(racks: int, per_rack: int) -> dict[str, str]:
    return {f"r{r}-n{n}": f"rack-{r}" for r in range(1, racks + 1) for n in range(1, per_rack + 1)}


def test_canary_nodes_then_rack_by_rack_in_natural_order() -> None:
    nodes = cluster(racks=10, per_rack=2)
    plan = build_plan(nodes, PlanPolicy(canary_nodes=1))
    assert plan.waves[0].kind is WaveKind.CANARY
    assert plan.waves[0].nodes == ("r1-n1",)
    assert plan.waves[1].nodes == ("r1-n2",)  # the rest of the canary's rack is the first rack wave
    assert [w.racks for w in plan.waves[1:]] == [(f"rack-{r}",) for r in range(1, 11)]
    assert sorted(n for w in plan.waves for n in w.nodes) == sorted(nodes), "every node exactly once"


def test_a_canary_rack_and_k_racks_per_wave() -> None:
    plan = build_plan(cluster(racks=5, per_rack=3), PlanPolicy(canary_rack="rack-3", max_parallel_racks=2))
    assert [(w.kind.value, w.racks) for w in plan.waves] == [
        ("canary", ("rack-3",)),
        ("racks", ("rack-1", "rack-2")),
        ("racks", ("rack-4", "rack-5")),
    ]
    assert len(plan.waves[1].nodes) == 6
    assert plan.wave_of()["r4-n2"] == 2


def test_a_canary_as_large_as_its_rack_takes_the_whole_rack() -> None:
    plan = build_plan(cluster(racks=2, per_rack=2), PlanPolicy(canary_nodes=3))
    assert [w.racks for w in plan.waves] == [("rack-1",), ("rack-2",)]


def test_a_canary_larger_than_the_cluster_is_refused_naming_the_option() -> None:
    with pytest.raises(ValidationError, match="canary_nodes: 5 canary nodes, more than the 4 the rollout covers"):
        build_plan(cluster(racks=2, per_rack=2), PlanPolicy(canary_nodes=5))
    assert len(build_plan(cluster(racks=1, per_rack=1), PlanPolicy(canary_nodes=1)).waves) == 1, "a one-node cluster"


def test_nodes_without_a_rack_in_a_cluster_of_racks_are_skipped_and_listed_with_why() -> None:
    nodes = {**cluster(racks=2, per_rack=1), "loose-2": "", "loose-10": ""}
    plan = build_plan(nodes, PlanPolicy(canary_nodes=0))
    assert [w.racks for w in plan.waves] == [("rack-1",), ("rack-2",)], "no wave of nodes without a rack"
    assert plan.skipped == (("loose-2", NO_RACK), ("loose-10", NO_RACK))
    text = plan.render()
    assert "2 waves, 2 nodes" in text and "skipped loose-2: no rack, in a cluster of racks" in text
    assert build_plan(dict(reversed(nodes.items())), PlanPolicy(canary_nodes=0)) == plan, "deterministic"


def test_a_cluster_without_racks_is_one_rack() -> None:
    plan = build_plan({"b": "", "a": ""}, PlanPolicy(canary_nodes=1))
    assert [(w.kind.value, w.nodes) for w in plan.waves] == [("canary", ("a",)), ("racks", ("b",))]
    assert plan.skipped == () and "(no rack)" in plan.render()


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (lambda: PlanPolicy(max_parallel_racks=0), "max_parallel_racks"),
        (lambda: PlanPolicy(canary_nodes=-1), "canary_nodes"),
        (lambda: build_plan(cluster(2, 1), PlanPolicy(canary_rack="rack-9")), "canary_rack"),
        (lambda: build_plan({}, PlanPolicy()), "nodes"),
    ],
)
def test_bad_options_name_the_option(policy: object, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        policy()  # type: ignore[operator]
    assert caught.value.field == field


def two_spines() -> dict[str, tuple[str, ...]]:
    """Topograph-like paths (spine, block, rack): spine s1 holds blocks b1 (racks 1-3) and b2 (rack 4), spine s2
    block b10 (racks 5-6); listed in an order that is neither."""
    racks = {1: ("s2", "b10"), 4: ("s1", "b2"), 2: ("s1", "b1"), 6: ("s2", "b10"), 3: ("s1", "b1"), 5: ("s2", "b10")}
    racks[10] = ("s1", "b1")
    return {f"r{r}-n{n}": (*tiers, f"rack-{r}") for r, tiers in racks.items() for n in (1, 2)}


def test_racks_go_block_by_block_and_a_wave_never_spans_two_blocks() -> None:
    nodes = {**two_spines(), "r1-n1": ("s1", "b1", "rack-1"), "r1-n2": ("s1", "b1", "rack-1")}
    plan = build_plan(nodes, PlanPolicy(canary_nodes=1, max_parallel_racks=2))
    assert [(w.group, w.racks) for w in plan.waves] == [
        (("s1", "b1"), ("rack-1",)),  # the canary: the first rack of the first block
        (("s1", "b1"), ("rack-1", "rack-2")),
        (("s1", "b1"), ("rack-3", "rack-10")),
        (("s1", "b2"), ("rack-4",)),  # alone: a wave of two racks would reach into the next block
        (("s2", "b10"), ("rack-5", "rack-6")),
    ]
    assert build_plan(dict(reversed(nodes.items())), PlanPolicy(canary_nodes=1, max_parallel_racks=2)) == plan
    lines = plan.render().splitlines()
    assert lines[0].split() == ["wave", "kind", "nodes", "group", "racks"]
    assert lines[4].split() == ["3", "racks", "2", "s1/b2", "rack-4"]


def test_eks_layers_and_gke_blocks_group_racks_the_same_way() -> None:
    def eks(layer1: str, layer2: str, layer3: str) -> dict[str, str]:
        prefix = "topology.k8s.aws/network-node-layer-"
        return {f"{prefix}1": layer1, f"{prefix}2": layer2, f"{prefix}3": layer3}

    def gke(block: str, subblock: str) -> dict[str, str]:
        return {"cloud.google.com/gce-topology-block": block, "cloud.google.com/gce-topology-subblock": subblock}

    for labels in (
        {"a": eks("nn-1", "nn-20", "nn-300"), "b": eks("nn-1", "nn-21", "nn-301"), "c": eks("nn-1", "nn-20", "nn-302")},
        {"a": gke("blk-9", "sb-1"), "b": gke("blk-10", "sb-2"), "c": gke("blk-9", "sb-3")},
    ):
        # What the agent sends: its rack, and the tiers above it as labels; the controller rebuilds the path.
        sent = {node: placement(values) for node, values in labels.items()}
        paths = {node: (*tiers_above(p.hierarchy), p.rack) for node, p in sent.items()}
        plan = build_plan(paths, PlanPolicy(canary_nodes=0, max_parallel_racks=3))
        assert [sorted(w.nodes) for w in plan.waves] == [["a", "c"], ["b"]], labels


def test_racks_without_tiers_come_after_the_groups_and_a_rack_follows_most_of_its_nodes() -> None:
    nodes: dict[str, str | tuple[str, ...]] = {"x": "rack-1", "y": ("b2", "rack-2"), "z": ("b1", "rack-3")}
    nodes |= {"y2": ("b2", "rack-2"), "y3": ("b1", "rack-2")}  # one mislabelled node does not move its rack
    plan = build_plan(nodes, PlanPolicy(canary_nodes=0, max_parallel_racks=5))
    assert [(w.group, w.racks) for w in plan.waves] == [
        (("b1",), ("rack-3",)),
        (("b2",), ("rack-2",)),
        ((), ("rack-1",)),
    ]
    assert plan.render().splitlines()[-2].split()[3] == "-"


@pytest.mark.parametrize("pause", [-1.0, float("nan"), float("inf"), 1e300, 30 * 86400.0 + 1])
def test_a_pause_between_waves_that_cannot_be_scheduled_is_refused(pause: float) -> None:
    with pytest.raises(ValidationError, match=r"pause_between_s: must be 0 to 2.592e\+06 s \(30 days\)"):
        PlanPolicy(pause_between_s=pause)
    assert PlanPolicy(pause_between_s=30 * 86400.0).pause_between_s == 2592000.0
