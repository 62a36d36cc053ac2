"""The search space: safe knobs only, version- and fabric-gated, site settings passed through."""

from __future__ import annotations

import pytest

from tests.tuner.landscape import NODES, ORDERS, synthetic_space
from topo_tune.errors import ConfigError, UnsafeKnobError
from topo_tune.tuner.space import FORBIDDEN, NATURAL_ORDER, RANK_ORDER, UNSET, Fabric, RankOrder, SearchSpace


def test_asking_to_search_nccl_proto_is_refused_citing_ll128_forcing() -> None:
    with pytest.raises(UnsafeKnobError) as error:
        synthetic_space(knobs=["NCCL_PROTO"])
    assert "LL128" in str(error.value) and "knobs.NCCL_PROTO" in str(error.value)


@pytest.mark.parametrize("knob", sorted(FORBIDDEN))
def test_every_dangerous_knob_is_refused_with_its_reason(knob: str) -> None:
    with pytest.raises(UnsafeKnobError, match=r"never searched"):
        synthetic_space(knobs=[knob.removeprefix("NCCL_")])


def test_site_settings_cannot_be_searched_and_unknown_knobs_name_the_searchable_ones() -> None:
    with pytest.raises(ConfigError, match=r"site setting"):
        synthetic_space(knobs=["NCCL_IB_HCA"])
    with pytest.raises(ConfigError, match=r"searchable: .*channels"):
        synthetic_space(knobs=["NCCL_WHATEVER"])


def test_an_infinite_ib_timeout_is_refused_even_as_a_site_setting() -> None:
    with pytest.raises(UnsafeKnobError, match=r"site_fixed.NCCL_IB_TIMEOUT"):
        synthetic_space(site_fixed={"NCCL_IB_TIMEOUT": "0"})
    with pytest.raises(ConfigError, match=r"site_fixed.NCCL_PROTO"):
        synthetic_space(site_fixed={"NCCL_PROTO": "Simple"})


def test_site_settings_pass_unchanged_into_every_configuration() -> None:
    space = synthetic_space()
    site = {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "eth0"}
    baseline = space.config(space.baseline_params())
    assert dict(baseline.env) == site, "the baseline is every knob unset plus the site settings"
    assert baseline.rank_order.name == NATURAL_ORDER
    tuned = space.config(space.params_for(env={"NCCL_NTHREADS": "256"}, rank_order="optimized"))
    assert dict(tuned.env) == {**site, "NCCL_NTHREADS": "256"}
    assert tuned.rank_order.nodes == ORDERS[1].nodes
    assert tuned.tuned_env(site) == {"NCCL_NTHREADS": "256"}


def test_channels_force_min_equal_max_and_follow_the_nccl_version() -> None:
    new = synthetic_space(nccl_version="2.28.3")
    old = synthetic_space(nccl_version="2.24.3")
    ancient = synthetic_space(nccl_version="2.16.5")
    assert max(int(v) for v in new.values_of("channels") if v != UNSET) == 64
    assert max(int(v) for v in old.values_of("channels") if v != UNSET) == 32
    assert "channels" not in ancient.names and "ib_split" not in ancient.names
    env = new.config({**new.baseline_params(), "channels": "24"}).env
    assert env["NCCL_MIN_CTAS"] == env["NCCL_MAX_CTAS"] == "24"


def test_the_fabric_decides_which_network_knobs_exist() -> None:
    one = RankOrder(NATURAL_ORDER, ("solo",))
    single = SearchSpace.build(
        nccl_version="2.28", fabric=Fabric(nodes=1, nvls=True), collectives=["all_reduce"], rank_orders=[one]
    )
    assert single.names == ("channels", "nthreads", "buffsize", "nvls")
    assert single.values_of("nvls") == (UNSET, "0"), "only 0 is a safe explicit NVLS value"
    sockets = SearchSpace.build(
        nccl_version="2.28",
        fabric=Fabric(nodes=4, ib=False, socket=True, cross_nic_values=(0, 2)),
        collectives=["all_reduce", "alltoall"],
        rank_orders=ORDERS,
    )
    assert {"socket_threads", "cross_nic", "p2p_chunk", "net_peer_channels", RANK_ORDER} <= set(sockets.names)
    assert "ib_qps" not in sockets.names
    assert sockets.values_of("cross_nic") == (UNSET, "0")
    for value in sockets.values_of("socket_threads"):
        env = sockets.config({**sockets.baseline_params(), "socket_threads": value}).env
        product = int(env.get("NCCL_SOCKET_NTHREADS", "1")) * int(env.get("NCCL_NSOCKS_PERTHREAD", "1"))
        assert product <= 64


def test_knobs_restrict_the_space_by_dimension_or_variable_name() -> None:
    space = synthetic_space(knobs=["channels", "IB_QPS_PER_CONNECTION"])
    assert space.names == ("channels", "ib_qps", RANK_ORDER)


def test_rank_orders_start_natural_and_cover_the_same_nodes() -> None:
    with pytest.raises(ConfigError, match=r"natural"):
        synthetic_space(rank_orders=ORDERS[1:])
    with pytest.raises(ConfigError, match=r"rank_orders\[odd\].nodes"):
        synthetic_space(rank_orders=[ORDERS[0], RankOrder("odd", (*NODES[:3], "node-9"))])


def test_values_outside_the_space_are_refused_naming_the_dimension() -> None:
    space = synthetic_space()
    with pytest.raises(ConfigError, match=r"params.nthreads"):
        space.config({**space.baseline_params(), "nthreads": "96"})
    with pytest.raises(ConfigError, match=r"env.NCCL_NTHREADS"):
        space.params_for(env={"NCCL_NTHREADS": "96"})
    with pytest.raises(ConfigError, match=r"nccl_version"):
        synthetic_space(nccl_version="two")


def test_the_fingerprint_changes_with_anything_that_shapes_a_trial() -> None:
    base = synthetic_space().fingerprint()
    assert synthetic_space().fingerprint() == base
    assert synthetic_space(site_fixed={"NCCL_IB_HCA": "mlx5_2"}).fingerprint() != base
    assert synthetic_space(nccl_version="2.24.3").fingerprint() != base
