from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from topo_tune.topology.distance import DistanceWeights, Measurement, gpu_pair_matrix, node_pair_matrix, pcie_gbps
from topo_tune.v1 import topology_pb2

Machine = Callable[[str], topology_pb2.NodeTopology]


def test_distance_formula_uses_the_documented_weights() -> None:
    w = DistanceWeights()
    assert (w.alpha_per_hop, w.beta, w.gamma_cross_numa) == (0.5, 1000.0, 1.0)
    assert w.distance(hops=4, bandwidth_gbps=20.0, cross_numa=True) == pytest.approx(0.5 * 4 + 1000 / 20 + 1.0)
    assert DistanceWeights(alpha_per_hop=0, beta=1, gamma_cross_numa=0).distance(
        hops=9, bandwidth_gbps=4, cross_numa=True
    ) == pytest.approx(0.25)


def test_nvswitch_pairs_model_far_above_pcie_pairs(machine: Machine) -> None:
    nv = gpu_pair_matrix(machine("hgx-h100-8nic"))
    assert nv.get("GPU0", "GPU7").bandwidth_gbps == pytest.approx(18 * 25.0)
    assert nv.get("GPU0", "GPU7").cross_numa is False
    pcie = gpu_pair_matrix(machine("pcie-2socket-8gpu"))
    same_switch = pcie.get("GPU0", "GPU1")
    across_sockets = pcie.get("GPU0", "GPU4")
    assert same_switch.bandwidth_gbps > across_sockets.bandwidth_gbps
    assert across_sockets.cross_numa and not same_switch.cross_numa
    assert across_sockets.distance > pcie.get("GPU0", "GPU2").distance > same_switch.distance
    assert nv.get("GPU0", "GPU1").distance < same_switch.distance


def test_measured_values_replace_modelled_ones_with_time_and_method(machine: Machine) -> None:
    m = gpu_pair_matrix(machine("pcie-2socket-8gpu"))
    when = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    measured = m.with_measurement("GPU4", "GPU0", Measurement(9.5, 4.2, when, "nccl-tests sendrecv 256MiB"))
    got = measured.get("GPU0", "GPU4")
    assert (got.bandwidth_gbps, got.latency_us, got.source, got.measured_at, got.method) == (
        9.5,
        4.2,
        "measured",
        when,
        "nccl-tests sendrecv 256MiB",
    )
    assert got.distance == pytest.approx(m.weights.distance(hops=got.hops, bandwidth_gbps=9.5, cross_numa=True))
    assert m.get("GPU0", "GPU4").source == "modelled", "the original matrix is unchanged"
    assert measured.bandwidth()[0][4] == measured.bandwidth()[4][0] == 9.5
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        Measurement(0.0, 1.0, when, "x")
    with pytest.raises(KeyError, match="GPU9"):
        m.with_measurement("GPU0", "GPU9", Measurement(1.0, 1.0, when, "x"))


def test_node_pairs_divide_cross_rack_bandwidth_by_the_oversubscription() -> None:
    m = node_pair_matrix(
        ["a", "b", "c"],
        injection_gbps={"a": 400.0, "b": 400.0, "c": None},
        rack_of={"a": "r1", "b": "r1", "c": "r2"},
        spine_oversubscription=4.0,
    )
    assert m.get("a", "b").bandwidth_gbps == 400.0 and m.get("a", "b").hops == 2
    assert m.get("a", "c").bandwidth_gbps == pytest.approx(1.25 / 4), "unknown NIC rate counts as 10 GbE"
    assert m.get("a", "c").latency_us > m.get("a", "b").latency_us
    capped = node_pair_matrix(
        ["a", "c"], injection_gbps={"a": 400.0, "c": 400.0}, rack_of={"a": "r1", "c": "r2"}, spine_gbps=800.0
    )
    assert capped.get("a", "c").bandwidth_gbps == pytest.approx(100.0), "800 Gb/s across the spine is 100 GB/s"
    with pytest.raises(ValueError, match="spine_oversubscription"):
        node_pair_matrix(["a"], injection_gbps={}, rack_of={}, spine_oversubscription=0.5)


def test_pcie_rates() -> None:
    assert pcie_gbps(5, 16) == pytest.approx(3.938 * 16 * 0.8)
    assert pcie_gbps(None, 16) is None and pcie_gbps(5, 0) is None
