"""Rollout plans: canary first, then racks in natural order, K at a time; deterministic and rendered."""

from __future__ import annotations

import pytest

from topo_tune.controller.rollout.plan import NO_RACK, PlanPolicy, WaveKind, build_plan
from topo_tune.errors import ValidationError


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
    plan = build_plan(cluster(racks=2, per_rack=2), PlanPolicy(canary_nodes=5))
    assert [w.racks for w in plan.waves] == [("rack-1",), ("rack-2",)]


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
