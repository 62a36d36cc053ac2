"""What a rollout's gates measure: cluster.yaml's ``rollout.gate``, overridden per rollout, stored with it."""

from __future__ import annotations

import pytest

from topo_tune.config.cluster import RolloutGateConfig, parse_cluster_config
from topo_tune.controller.api.rollout_messages import from_proto_policy, to_proto_gate
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.errors import ValidationError
from topo_tune.v1 import admin_pb2


def _create(gate: admin_pb2.GateMeasurement, site: RolloutGateConfig) -> PlanPolicy:
    return from_proto_policy(admin_pb2.CreateRolloutRequest(gate=gate), gate_defaults=site)


def test_a_rollout_overrides_only_what_it_gives_and_keeps_it_through_storage() -> None:
    site = RolloutGateConfig(repeats=12, max_bytes=1 << 26)
    policy = _create(admin_pb2.GateMeasurement(repeats=3, min_bytes=1 << 19, max_bytes=0, iters=0), site)
    assert policy.gate == RolloutGateConfig(repeats=3, min_bytes=1 << 19, max_bytes=1 << 26)
    assert PlanPolicy.from_json(policy.to_json()) == policy
    stored_before_gates_were_configurable = {k: v for k, v in policy.to_json().items() if k != "gate"}
    assert PlanPolicy.from_json(stored_before_gates_were_configurable).gate == RolloutGateConfig()


@pytest.mark.parametrize(
    ("gate", "error"),
    [
        (admin_pb2.GateMeasurement(repeats=1001), "gate.repeats: input should be less than or equal to 1000"),
        (admin_pb2.GateMeasurement(min_bytes=2 << 20, max_bytes=1 << 20), "gate: maxBytes must not be below minBytes"),
        (admin_pb2.GateMeasurement(step_factor=1), "gate.step_factor: input should be greater than or equal to 2"),
        (admin_pb2.GateMeasurement(iters=10_001), "gate.iters: input should be less than or equal to 10000"),
    ],
)
def test_a_bad_gate_request_names_the_field_as_cluster_yaml_does(gate: admin_pb2.GateMeasurement, error: str) -> None:
    with pytest.raises(ValidationError) as raised:
        _create(gate, RolloutGateConfig())
    assert str(raised.value) == error


@pytest.mark.parametrize(
    ("stored", "field"),
    [({"sizes": 1}, "gate.sizes"), ({"cuda_graph": "maybe"}, "gate.cuda_graph"), ({"repeats": 0}, "gate.repeats")],
)
def test_a_bad_stored_gate_names_the_field(stored: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match="^" + field.replace(".", r"\.") + ": "):
        PlanPolicy.from_json({"gate": stored})


@pytest.mark.parametrize(
    ("site", "asked", "expected"),
    [(False, None, False), (True, None, True), (False, True, True), (True, False, False)],
)
def test_graph_timing_of_the_gates_is_the_sites_unless_the_rollout_says(
    site: bool, asked: bool | None, expected: bool
) -> None:
    # On the wire an unset cuda_graph keeps cluster.yaml's choice; a set one wins either way (false included).
    policy = _create(admin_pb2.GateMeasurement(repeats=3, cuda_graph=asked), RolloutGateConfig(cuda_graph=site))
    assert policy.gate == RolloutGateConfig(repeats=3, cuda_graph=expected)
    assert PlanPolicy.from_json(policy.to_json()).gate.cuda_graph is expected, "stored with the rollout"
    assert to_proto_gate(policy.gate).cuda_graph is expected


def test_cluster_yaml_sets_graph_timing_of_the_gates_for_nccl_only() -> None:
    nccl = parse_cluster_config(
        {"apiVersion": "topo-tune/v1", "backend": "nccl", "rollout": {"gate": {"cudaGraph": True}}}
    )
    assert nccl.rollout.gate.cuda_graph is True
