"""What a rollout's gates measure: validated per field, defaults from cluster.yaml, overrides per rollout."""

from __future__ import annotations

import dataclasses

import pytest

from topo_tune.cluster_config import parse_cluster_config
from topo_tune.controller.rollout.gate_measurement import GateMeasurement
from topo_tune.controller.rollout.gates import GateThresholds
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.controller.rollout.service import gate_message, policy_from
from topo_tune.errors import ValidationError
from topo_tune.v1 import admin_pb2


def test_cluster_yaml_defaults_are_the_gates_defaults() -> None:
    rollout = parse_cluster_config({"apiVersion": "topo-tune/v1"}).rollout
    assert GateMeasurement(**rollout.gate.model_dump()) == GateMeasurement()
    assert GateThresholds(**rollout.thresholds.model_dump()) == GateThresholds()


def test_a_rollout_overrides_only_what_it_gives_and_keeps_it_through_storage() -> None:
    site = GateMeasurement(repeats=12, max_bytes=1 << 26)
    gate = site.overridden({"repeats": 3, "min_bytes": 1 << 19, "max_bytes": 0, "iters": 0})
    assert gate == GateMeasurement(repeats=3, min_bytes=1 << 19, max_bytes=1 << 26)
    policy = PlanPolicy(canary_rack="r1", gate=gate)
    assert PlanPolicy.from_json(dataclasses.asdict(policy)) == policy
    stored_before_gates_were_configurable = {k: v for k, v in dataclasses.asdict(policy).items() if k != "gate"}
    assert PlanPolicy.from_json(stored_before_gates_were_configurable).gate == GateMeasurement()


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"repeats": 0}, "gate.repeats"),
        ({"min_bytes": 2 << 20, "max_bytes": 1 << 20}, "gate.min_bytes"),
        ({"step_factor": 1}, "gate.step_factor"),
        ({"iters": 0}, "gate.iters"),
        ({"sizes": 1}, "gate.sizes"),
        ({"cuda_graph": "yes"}, "gate.cuda_graph"),
    ],
)
def test_bad_gate_settings_name_the_field(values: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        GateMeasurement.from_mapping(values)


@pytest.mark.parametrize(
    ("site", "asked", "expected"),
    [(False, None, False), (True, None, True), (False, True, True), (True, False, False)],
)
def test_graph_timing_of_the_gates_is_the_sites_unless_the_rollout_says(
    site: bool, asked: bool | None, expected: bool
) -> None:
    # On the wire an unset cuda_graph keeps cluster.yaml's choice; a set one wins either way (false included).
    request = admin_pb2.CreateRolloutRequest(gate=admin_pb2.GateMeasurement(repeats=3, cuda_graph=asked))
    policy = policy_from(request, gate_defaults=GateMeasurement(cuda_graph=site))
    assert policy.gate == GateMeasurement(repeats=3, cuda_graph=expected)
    assert PlanPolicy.from_json(dataclasses.asdict(policy)).gate.cuda_graph is expected, "stored with the rollout"
    assert gate_message(policy.gate).cuda_graph is expected


def test_cluster_yaml_sets_graph_timing_of_the_gates_for_nccl_only() -> None:
    nccl = parse_cluster_config(
        {"apiVersion": "topo-tune/v1", "backend": "nccl", "rollout": {"gate": {"cudaGraph": True}}}
    )
    assert GateMeasurement(**nccl.rollout.gate.model_dump()).cuda_graph is True
