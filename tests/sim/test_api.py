"""The simulator's public surface: results labelled simulated, seeded noise, clear errors, a pure package."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from topo_tune import sim
from topo_tune.sim import Collective, SimInputError, bus_factor, simulate, to_benchmark_result
from topo_tune.sim.demo import demo_cluster, h200_vm_pair

SIZES = [8, 1024, 1 << 20, 1 << 26]


def _run(**overrides: object) -> sim.SimResult:
    cluster = demo_cluster()
    kwargs: dict[str, object] = {
        "collective": "all_reduce",
        "sizes": SIZES,
        "env": {},
        "rank_order": cluster.node_names,
        "seed": 7,
    }
    kwargs.update(overrides)
    return simulate(cluster, **kwargs)  # type: ignore[arg-type]


def test_public_names_are_exactly_the_documented_ones() -> None:
    for name in sim.__all__:
        assert hasattr(sim, name), name
    public = {n for n in dir(sim) if not n.startswith("_") and not isinstance(getattr(sim, n), type(sim))}
    assert public == set(sim.__all__)


def test_every_result_is_labelled_simulated_on_the_wire_too() -> None:
    result = _run(env={"NCCL_IB_QPS_PER_CONNECTION": "4", "NCCL_IB_HCA": "mlx5"})
    assert result.simulated is True
    message = to_benchmark_result(result, job_id="job-1", rank=0)
    assert message.simulated is True
    assert message.job_id == "job-1"
    assert [s.bytes for s in message.sizes] == SIZES
    assert dict(message.effective_env) == {"NCCL_IB_QPS_PER_CONNECTION": "4", "NCCL_IB_HCA": "mlx5"}
    for wire, point in zip(message.sizes, result.sizes, strict=True):
        assert wire.time_us == pytest.approx(point.time_us)
        assert wire.busbw_gbps == pytest.approx(point.busbw_gbs)
        assert wire.count == point.bytes // 4
        assert wire.wrong == 0
        assert wire.p50_us <= wire.time_us <= wire.p99_us


def test_busbw_follows_nccl_tests_factors() -> None:
    assert bus_factor(Collective.ALL_REDUCE, 8) == pytest.approx(2 * 7 / 8)
    for coll in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALLTOALL):
        assert bus_factor(coll, 8) == pytest.approx(7 / 8)
    for coll in (Collective.BROADCAST, Collective.REDUCE, Collective.SENDRECV):
        assert bus_factor(coll, 8) == 1.0
    result = _run()
    for point in result.sizes:
        assert point.algbw_gbs == pytest.approx(point.bytes / (point.time_us * 1e3))
        assert point.busbw_gbs == pytest.approx(point.algbw_gbs * 2 * 63 / 64)


def test_noise_is_deterministic_given_the_seed_and_differs_between_seeds() -> None:
    a, b, c = _run(seed=1), _run(seed=1), _run(seed=2)
    assert a == b
    assert [s.time_us for s in a.sizes] != [s.time_us for s in c.sizes]
    assert [s.model_time_us for s in a.sizes] == [s.model_time_us for s in c.sizes]


def test_noise_is_small_and_centred_on_the_model() -> None:
    cluster = h200_vm_pair()
    size = 1 << 28
    ratios = [
        simulate(cluster, collective="all_reduce", sizes=[size], env={}, rank_order=cluster.node_names, seed=s)
        .sizes[0]
        .time_us
        / simulate(cluster, collective="all_reduce", sizes=[size], env={}, rank_order=cluster.node_names, seed=0)
        .sizes[0]
        .model_time_us
        for s in range(200)
    ]
    mean = sum(ratios) / len(ratios)
    spread = math.sqrt(sum((r - mean) ** 2 for r in ratios) / len(ratios))
    assert abs(mean - 1) < 0.005
    assert 0.005 < spread < 0.05


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"rank_order": ["gpu-01", "nope"]}, "rank_order"),
        ({"rank_order": ["gpu-01", "gpu-01"]}, "rank_order"),
        ({"rank_order": []}, "rank_order"),
        ({"collective": "allreduce"}, "collective"),
        ({"sizes": [0]}, "sizes"),
        ({"dtype": "float128"}, "dtype"),
        ({"seed": "7"}, "seed"),
        ({"env": {"NCCL_MIN_CTAS": "many"}}, "env.NCCL_MIN_CTAS"),
        ({"env": {"NCCL_MAX_CTAS": "65"}}, "env.NCCL_MAX_CTAS"),
        ({"env": {"NCCL_NTHREADS": "100"}}, "env.NCCL_NTHREADS"),
        ({"env": {"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"}}, "env.NCCL_NSOCKS_PERTHREAD"),
        ({"env": {"NCCL_CROSS_NIC": "3"}}, "env.NCCL_CROSS_NIC"),
        ({"env": {"NCCL_IB_QPS_PER_CONNECTION": "0"}}, "env.NCCL_IB_QPS_PER_CONNECTION"),
        ({"env": {"NCCL_ALGO": "allreduce:tree"}}, "env.NCCL_ALGO"),
        ({"env": {"NCCL_ALGO": "Rings"}}, "env.NCCL_ALGO"),
        ({"env": {"NCCL_PROTO": "LL129"}}, "env.NCCL_PROTO"),
    ],
)
def test_bad_input_is_refused_naming_the_argument_or_variable(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(SimInputError) as caught:
        _run(**overrides)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_an_algorithm_list_that_leaves_nothing_for_the_collective_is_an_error() -> None:
    with pytest.raises(SimInputError, match="NCCL_ALGO"):
        _run(collective="broadcast", env={"NCCL_ALGO": "Tree"})


def test_nccl_algo_and_proto_restrict_the_choice() -> None:
    result = _run(env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})
    assert {(s.algorithm, s.protocol) for s in result.sizes} == {("Ring", "Simple")}
    excluded = _run(env={"NCCL_ALGO": "^NVLSTree,Tree"})
    assert {s.algorithm for s in excluded.sizes} == {"Ring"}


def test_the_package_imports_no_grpc() -> None:
    code = "import sys, topo_tune.sim, topo_tune.sim.topology_import; sys.exit('grpc' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
