"""What a simulated probe reads: the slowest NIC paces a node, a degraded uplink slows its rack's crossings."""

from __future__ import annotations

import pytest

from topo_tune.errors import SimInputError
from topo_tune.sim.cluster import Cluster, Nic, RackUplink, SpineTier
from topo_tune.sim.demo import h100_node, ndr_nics
from topo_tune.sim.pair_figures import pair_matrices


def _cluster(uplinks: tuple[RackUplink, ...] = ()) -> Cluster:
    nodes = [h100_node(f"{rack}-{i}", rack) for rack in ("a", "b", "c", "d") for i in range(4)]
    slow_nics = list(ndr_nics())
    slow_nics[5] = Nic(name=slow_nics[5].name, line_rate_gbps=200.0, rail=5)
    slow = nodes[1]
    nodes[1] = type(slow)(slow.name, slow.rack, slow.gpus, slow.fabric, tuple(slow_nics), slow.profile)
    return Cluster(nodes=tuple(nodes), spine=SpineTier(oversubscription=2.0, uplinks=uplinks))


def test_pairs_follow_nics_spine_and_uplinks() -> None:
    cluster = _cluster((RackUplink("c", 0.5),))
    bw, lat = pair_matrices(cluster)
    i = {name: k for k, name in enumerate(cluster.node_names)}
    assert bw[i["a-0"], i["a-2"]] == pytest.approx(400.0)  # 8 x 400 Gb/s
    assert bw[i["a-1"], i["a-2"]] == pytest.approx(200.0), "one NIC at half rate paces all eight rails"
    assert bw[i["b-0"], i["d-0"]] == pytest.approx(200.0), "2:1 spine"
    assert bw[i["b-0"], i["c-0"]] == pytest.approx(100.0), "rack c's uplink carries half"
    assert lat[i["a-0"], i["b-0"]] > lat[i["a-0"], i["a-2"]]
    assert (bw == bw.T).all()


def test_an_uplink_of_an_unknown_rack_is_refused() -> None:
    with pytest.raises(SimInputError, match=r"spine\.uplinks"):
        _cluster((RackUplink("nowhere", 0.5),))
    with pytest.raises(SimInputError, match="share"):
        RackUplink("a", 0.0)
