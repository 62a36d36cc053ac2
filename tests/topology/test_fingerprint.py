from __future__ import annotations

import random
from collections.abc import Callable

from topo_tune.topology.fingerprint import cluster_fingerprint, topology_fingerprint
from topo_tune.v1 import topology_pb2

Machine = Callable[[str], topology_pb2.NodeTopology]


def _relabel(topo: topology_pb2.NodeTopology, seed: int) -> topology_pb2.NodeTopology:
    """The same hardware seen by another discovery: shuffled GPU indices and list order, new serials, names."""
    rng = random.Random(seed)
    out = topology_pb2.NodeTopology()
    out.CopyFrom(topo)
    perm = list(range(len(topo.gpus)))
    rng.shuffle(perm)
    out.hostname = f"other-{seed}"
    del out.gpus[:]
    gpus = list(topo.gpus)
    rng.shuffle(gpus)
    for gpu in gpus:
        new = out.gpus.add()
        new.CopyFrom(gpu)
        new.index = perm[gpu.index]
        new.uuid = f"GPU-{rng.getrandbits(64):016x}"
        new.pci_bus_id = f"0000:{rng.randrange(256):02x}:00.0"
    del out.gpu_links[:]
    links = list(topo.gpu_links)
    rng.shuffle(links)
    for link in links:
        new_link = out.gpu_links.add()
        new_link.CopyFrom(link)
        a, b = sorted((perm[link.gpu_a], perm[link.gpu_b]))
        new_link.gpu_a, new_link.gpu_b = a, b
    names = {nic.name: f"nic{rng.getrandbits(16)}" for nic in topo.nics}
    for nic in out.nics:
        nic.name = names[nic.name]
    for aff in out.nic_affinities:
        aff.nic = names[aff.nic]
        aff.gpu = perm[aff.gpu]
    out.versions.driver = "999.0"
    del out.unknowns[:]
    return out


def test_fingerprint_is_stable_under_reordering_serials_and_names(machine: Machine) -> None:
    for name in ("hgx-h100-8nic", "pcie-2socket-8gpu", "h200-vm"):
        topo = machine(name)
        expected = topology_fingerprint(topo)
        assert expected.startswith("tf1-")
        for seed in range(5):
            assert topology_fingerprint(_relabel(topo, seed)) == expected, (name, seed)


def test_fingerprint_changes_when_the_hardware_does(machine: Machine) -> None:
    hgx = machine("hgx-h100-8nic")
    base = topology_fingerprint(hgx)
    fewer_links = topology_pb2.NodeTopology()
    fewer_links.CopyFrom(hgx)
    fewer_links.gpu_links[0].nvlink_count = 12
    slower_nic = topology_pb2.NodeTopology()
    slower_nic.CopyFrom(hgx)
    slower_nic.nics[3].rate_gbps = 200.0
    moved_nic = topology_pb2.NodeTopology()
    moved_nic.CopyFrom(hgx)
    moved_nic.nic_affinities[0].kind = topology_pb2.LINK_KIND_NODE
    prints = {
        base,
        topology_fingerprint(fewer_links),
        topology_fingerprint(slower_nic),
        topology_fingerprint(moved_nic),
    }
    assert len(prints) == 4
    assert topology_fingerprint(machine("pcie-2socket-8gpu")) != base


def test_cluster_fingerprint_ignores_rack_and_node_order() -> None:
    a = cluster_fingerprint([["x", "y"], ["z"]])
    assert a == cluster_fingerprint([["z"], ["y", "x"]])
    assert a != cluster_fingerprint([["x"], ["y", "z"]])
