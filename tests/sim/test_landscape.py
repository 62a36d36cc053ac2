"""What a tuner searching the sim backend meets: each knob and the ring order move figures as in NCCL.

These pin the shape of the landscape (who wins where), not exact numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from topo_tune.sim import Cluster, IntraNodeFabric, Nic, Node, NodePairMeasurement, SpineTier, Transport, simulate
from topo_tune.sim.demo import defaults_optimal_cluster, demo_cluster, h100_node
from topo_tune.sim.profiles import H100_SXM, PCIE_GEN4, PCIE_GPU

MIB = 1 << 20
LARGE = 256 * MIB
ALL = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv")


def _time(
    cluster: Cluster,
    order: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    collective: str = "all_reduce",
    size: int = LARGE,
) -> float:
    result = simulate(cluster, collective=collective, sizes=[size], env=env or {}, rank_order=order, seed=0)
    return result.sizes[0].model_time_us


def _grouped(cluster: Cluster) -> list[str]:
    return [n.name for rack in cluster.racks for n in cluster.nodes if n.rack == rack]


def test_demo_hostname_order_crosses_the_slow_spine_at_every_hop_and_loses_to_a_rack_grouped_order() -> None:
    cluster = demo_cluster()
    hostname_order = sorted(cluster.node_names)
    for collective in ("all_reduce", "all_gather", "broadcast"):
        slow = _time(cluster, hostname_order, collective=collective)
        fast = _time(cluster, _grouped(cluster), collective=collective)
        assert slow > 2.0 * fast, collective


def test_a_ring_is_as_slow_as_its_slowest_hop_so_a_probed_slow_pair_matters_only_when_adjacent() -> None:
    base = demo_cluster()
    order = _grouped(base)
    # A degraded cable between the first two nodes of rack-a, as a probe would report it.
    probed = Cluster(
        nodes=base.nodes,
        spine=base.spine,
        measured=(NodePairMeasurement(order[0], order[1], bandwidth_gbs=60.0, latency_us=3.0),),
    )
    env = {"NCCL_ALGO": "Ring"}
    assert _time(probed, order, env) > 2.0 * _time(base, order, env)
    # Same racks grouped, but the two nodes no longer neighbours: the ring avoids the bad link.
    avoiding = [order[0], order[2], order[1], order[3], *order[4:]]
    assert _time(probed, avoiding, env) < 1.05 * _time(base, avoiding, env)


def test_spine_oversubscription_slows_cross_rack_rings() -> None:
    order = _grouped(demo_cluster())
    times = [_time(demo_cluster(oversubscription=o), order, {"NCCL_ALGO": "Ring"}) for o in (1.0, 2.0, 4.0, 8.0)]
    assert times == sorted(times)
    assert times[-1] > 2.0 * times[0]


def test_qps_per_connection_has_an_interior_optimum_on_an_ecmp_spine() -> None:
    cluster = demo_cluster()
    order = _grouped(cluster)
    by_qps = {q: _time(cluster, order, {"NCCL_IB_QPS_PER_CONNECTION": str(q)}) for q in (1, 4, 16, 128)}
    assert by_qps[4] < 0.95 * by_qps[1]
    assert by_qps[128] > 1.05 * min(by_qps.values())
    # Without a spine there is nothing to hash: QPs make no difference.
    flat = Cluster(nodes=cluster.nodes)
    assert abs(_time(flat, order, {"NCCL_IB_QPS_PER_CONNECTION": "4"}) / _time(flat, order) - 1) < 0.01


def test_cross_nic_1_hurts_a_rail_optimized_fabric_only() -> None:
    cluster = demo_cluster()
    order = _grouped(cluster)
    env = {"NCCL_ALGO": "Ring", "NCCL_CROSS_NIC": "1"}
    assert _time(cluster, order, env) > 1.2 * _time(cluster, order, {"NCCL_ALGO": "Ring"})
    single_tier = Cluster(nodes=cluster.nodes, spine=cluster.spine, rail_optimized=False)
    ratio = _time(single_tier, order, env) / _time(single_tier, order, {"NCCL_ALGO": "Ring"})
    assert abs(ratio - 1) < 0.01


def test_pxn_keeps_alltoall_on_its_rail() -> None:
    cluster = demo_cluster()
    order = _grouped(cluster)
    off = _time(cluster, order, {"NCCL_PXN_DISABLE": "1"}, collective="alltoall")
    assert off > 1.15 * _time(cluster, order, collective="alltoall")


def test_alltoall_does_not_depend_on_ring_order() -> None:
    cluster = demo_cluster()
    a = _time(cluster, sorted(cluster.node_names), collective="alltoall")
    assert abs(a / _time(cluster, _grouped(cluster), collective="alltoall") - 1) < 1e-9


def test_p2p_net_chunk_size_trades_overhead_against_fill() -> None:
    cluster = demo_cluster()
    order = _grouped(cluster)

    def t(chunk: int, size: int) -> float:
        return _time(cluster, order, {"NCCL_P2P_NET_CHUNKSIZE": str(chunk)}, collective="sendrecv", size=size)

    assert t(512 * 1024, LARGE) < 0.9 * t(32 * 1024, LARGE)


def test_nvls_wins_large_allreduce_on_nvswitch_and_disabling_it_costs() -> None:
    cluster = defaults_optimal_cluster()
    order = cluster.node_names
    assert _time(cluster, order, {"NCCL_NVLS_ENABLE": "0"}) > 1.2 * _time(cluster, order)
    result = simulate(cluster, collective="all_reduce", sizes=[LARGE], env={}, rank_order=order, seed=0)
    assert result.sizes[0].algorithm == "NVLS"


def _socket_cluster() -> Cluster:
    nodes = tuple(
        Node(
            name=f"eth-{i}",
            rack="rack-a",
            gpus=4,
            fabric=PCIE_GEN4,
            nics=(Nic(name="eth0", line_rate_gbps=100.0, transport=Transport.SOCKET),),
            profile=PCIE_GPU,
        )
        for i in range(4)
    )
    return Cluster(nodes=nodes)


def test_socket_threads_times_sockets_has_an_interior_optimum() -> None:
    cluster = _socket_cluster()
    order = cluster.node_names

    def t(threads: int, socks: int) -> float:
        env = {"NCCL_SOCKET_NTHREADS": str(threads), "NCCL_NSOCKS_PERTHREAD": str(socks)}
        return _time(cluster, order, env)

    assert t(2, 2) < 0.6 * t(1, 1)  # one TCP stream per channel cannot fill 100G
    assert t(16, 4) > 1.1 * t(2, 2)  # 64 streams per connection cost more CPU than they bring
    # RDMA NICs ignore the socket knobs.
    ib = demo_cluster()
    ratio = _time(ib, _grouped(ib), {"NCCL_SOCKET_NTHREADS": "4"}) / _time(ib, _grouped(ib))
    assert abs(ratio - 1) < 1e-9


def test_every_collective_gives_finite_positive_figures_that_grow_with_size() -> None:
    cluster = demo_cluster()
    order = _grouped(cluster)
    sizes = [1 << k for k in range(3, 31, 3)]
    for collective in ALL:
        result = simulate(cluster, collective=collective, sizes=sizes, env={}, rank_order=order, seed=1)
        times = [s.model_time_us for s in result.sizes]
        assert all(t > 0 for t in times), collective
        assert times[-1] > 10 * times[0], collective
        assert all(s.busbw_gbs > 0 and s.algbw_gbs > 0 for s in result.sizes)


def _grid() -> list[dict[str, str]]:
    """The knobs a tuner searches on one node, on a coarse grid (NCCL's safe search space)."""
    axes = {
        "NCCL_MIN_CTAS": [None, "4", "16", "32", "64"],
        "NCCL_NTHREADS": [None, "128", "256"],
        "NCCL_BUFFSIZE": [None, str(1 * MIB), str(16 * MIB)],
        "NCCL_NVLS_ENABLE": [None, "0"],
        "NCCL_P2P_NVL_CHUNKSIZE": [None, str(128 * 1024), str(2 * MIB)],
        "NCCL_IB_QPS_PER_CONNECTION": [None, "8"],
    }
    envs = []
    for values in itertools.product(*axes.values()):
        env = {k: v for k, v in zip(axes, values, strict=True) if v is not None}
        if "NCCL_MIN_CTAS" in env:
            env["NCCL_MAX_CTAS"] = env["NCCL_MIN_CTAS"]
        envs.append(env)
    return envs


def test_on_the_defaults_optimal_cluster_no_searched_config_beats_the_defaults_by_3_percent() -> None:
    cluster = defaults_optimal_cluster()
    order = cluster.node_names
    sizes = [1 << k for k in range(8, 31, 2)]
    for collective in ALL:
        base = simulate(cluster, collective=collective, sizes=sizes, env={}, rank_order=order, seed=0)
        for env in _grid():
            other = simulate(cluster, collective=collective, sizes=sizes, env=env, rank_order=order, seed=0)
            for b, o in zip(base.sizes, other.sizes, strict=True):
                assert b.model_time_us <= 1.03 * o.model_time_us, (collective, b.bytes, env)


def test_on_the_demo_cluster_the_defaults_leave_a_lot_on_the_table() -> None:
    cluster = demo_cluster()
    default = _time(cluster, sorted(cluster.node_names))
    tuned = _time(cluster, _grouped(cluster), {"NCCL_IB_QPS_PER_CONNECTION": "8", "NCCL_MIN_CTAS": "64"})
    assert default > 2.5 * tuned


def test_the_best_knobs_depend_on_the_message_size() -> None:
    cluster = demo_cluster()
    order = _grouped(cluster)
    # More channels help the spine-bound large messages and cost at small ones.
    env = {"NCCL_MIN_CTAS": "64", "NCCL_MAX_CTAS": "64"}
    assert _time(cluster, order, env) < 0.95 * _time(cluster, order)
    assert _time(cluster, order, env, size=64 * 1024) > _time(cluster, order, size=64 * 1024)


def test_mixed_gpu_counts_in_one_job_are_refused() -> None:
    import pytest

    from topo_tune.sim import SimInputError

    small = Node(
        name="four",
        rack="rack-a",
        gpus=4,
        fabric=IntraNodeFabric(kind=h100_node("x", "r").fabric.kind, bandwidth_gbs=450.0),
        nics=h100_node("x", "r").nics,
        profile=H100_SXM,
    )
    cluster = Cluster(nodes=(h100_node("eight", "rack-a"), small), spine=SpineTier())
    with pytest.raises(SimInputError, match="rank_order"):
        _time(cluster, ["eight", "four"])
