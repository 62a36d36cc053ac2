from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.topology.conftest import FIXTURES
from topo_tune.errors import NcclXmlError
from topo_tune.topology.matrix import node_matrix
from topo_tune.topology.nccl_dump import read_nccl_topology
from topo_tune.topology.nccl_topo_file import vm_topology_file
from topo_tune.topology.nccl_xml import parse_xml, render_xml
from topo_tune.v1 import topology_pb2

XML = [
    *sorted((FIXTURES / "nccl-xml").glob("*.xml")),
    FIXTURES / "h200-vm" / "nccl-topo-dump.xml",
    FIXTURES / "h200-x2-vm" / "nccl-topo-dump.xml",
]
Machine = Callable[[str], topology_pb2.NodeTopology]


@pytest.mark.parametrize("path", XML, ids=lambda p: p.name)
def test_real_files_round_trip_without_loss(path: Path) -> None:
    text = path.read_text()
    topo = read_nccl_topology(text, source=path.name)
    assert render_xml(topo.nccl_topology) == text
    again = read_nccl_topology(render_xml(topo.nccl_topology), source=path.name)
    assert again == topo


def test_ndv5_file_pairs_each_gpu_with_its_nic() -> None:
    topo = read_nccl_topology((FIXTURES / "nccl-xml" / "azure-ndv5-topo.xml").read_text(), source="ndv5")
    m = node_matrix(topo)
    assert len(topo.gpus) == 8 and len(topo.nics) == 8
    for g in range(8):
        row = [m.cell(f"GPU{g}", f"NIC{n}") for n in range(8)]
        assert row.count("PIX") == 1 and row.index("PIX") == g
        assert row.count("SYS") == 4
    assert m.cpu_affinity[0] == "48-95" and m.cpu_affinity[4] == "0-47"
    assert all(n.link_layer == topology_pb2.NIC_LINK_LAYER_INFINIBAND for n in topo.nics)


def test_h200_dump_agrees_with_discovery_and_keeps_numa_unknown(machine: Machine) -> None:
    dump = read_nccl_topology((FIXTURES / "h200-vm" / "nccl-topo-dump.xml").read_text(), source="h200")
    discovered = machine("h200-vm")
    assert dump.gpus[0].pci_bus_id == discovered.gpus[0].pci_bus_id == "0000:00:06.0"
    assert dump.gpus[0].sm_arch == discovered.gpus[0].sm_arch == "sm_90"
    assert not dump.gpus[0].HasField("numa_node")
    assert not dump.gpus[0].HasField("pcie_width_max"), 'link_width="0" means unknown, not zero lanes'
    (eth,) = dump.nics
    assert eth.name == "eth0" and eth.rate_gbps == 10.0 and eth.gdr is False
    assert eth.link_layer == topology_pb2.NIC_LINK_LAYER_ETHERNET


def test_two_gpu_h200_dump_agrees_with_discovery(machine: Machine) -> None:
    # Dumped by NCCL 2.28.9 during a two-rank init on the VM whose NVML answers are h200-x2-vm's.
    dump = read_nccl_topology((FIXTURES / "h200-x2-vm" / "nccl-topo-dump.xml").read_text(), source="h200-x2")
    discovered = machine("h200-x2-vm")
    assert [g.pci_bus_id for g in dump.gpus] == [g.pci_bus_id for g in discovered.gpus]
    [(a, b)] = [
        ((x.gpu_a, x.gpu_b, x.nvlink_count, x.via_nvswitch), (y.gpu_a, y.gpu_b, y.nvlink_count, y.via_nvswitch))
        for x, y in zip(dump.gpu_links, discovered.gpu_links, strict=True)
    ]
    assert a == b == (0, 1, 18, True)
    assert all(not g.HasField("numa_node") for g in dump.gpus)


def test_ncv4_self_targeted_nvlinks_are_reported_not_guessed() -> None:
    topo = read_nccl_topology((FIXTURES / "nccl-xml" / "azure-ncv4-topo.xml").read_text(), source="ncv4")
    assert all(link.kind == topology_pb2.LINK_KIND_SYS for link in topo.gpu_links)
    assert sum("name the GPU itself" in u for u in topo.unknowns) == 4
    assert [g.cpu_affinity for g in topo.gpus] == ["0-23", "24-47", "48-71", "72-95"]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (
            '<system version="1">\n  <cpu numaid="0">\n    <pci busid="0000:01:00.0">\n  </cpu>\n</system>',
            4,
            "mismatched",
        ),
        ('<system version="1">\n  <cpu numaid="0">\n    <pci class="0x030200"/>\n  </cpu>\n</system>', 3, "busid"),
        ('<system version="1">\n\n  <cpu numaid="zero"/>\n</system>', 3, "numaid"),
        ('<system version="1">\n  <cpu numaid="0">\n    <gpu dev="0"/>\n  </cpu>\n</system>', 3, "<gpu> outside"),
        ("<topology/>", 1, "<system>"),
    ],
)
def test_malformed_files_name_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(NcclXmlError) as info:
        read_nccl_topology(text, source="bad.xml")
    assert info.value.line == line
    assert f"bad.xml, line {line}:" in str(info.value) and words in str(info.value)


def test_vm_file_from_a_discovered_host_keeps_its_pci_shape(machine: Machine) -> None:
    host = machine("hgx-h100-8nic")
    mapping = {g.pci_bus_id: f"{g.index + 1:04x}:00:00.0" for g in host.gpus}
    mapping.update({n.pci_bus_id: f"{0x100 + i:04x}:00:00.0" for i, n in enumerate(host.nics)})
    text = vm_topology_file(host, bus_ids=mapping)
    root = parse_xml(text)
    tags = {node.tag for node in _walk(root)}
    assert tags == {"system", "cpu", "pci"}, "a VM topology file carries only CPUs and the PCI tree"
    vm = read_nccl_topology(text, source="vm.xml")
    assert sorted(g.pci_bus_id for g in vm.gpus) == sorted(mapping[g.pci_bus_id] for g in host.gpus)
    # The VM sees the same GPU↔NIC pairing as the host: each GPU's single PIX NIC is its host partner's.
    host_pairs = {(a.gpu, a.nic) for a in host.nic_affinities if a.kind == topology_pb2.LINK_KIND_PIX}
    vm_gpu = {g.pci_bus_id: g.index for g in vm.gpus}
    host_gpu_bus = {g.index: g.pci_bus_id for g in host.gpus}
    host_nic_bus = {n.name: n.pci_bus_id for n in host.nics}
    vm_pairs = {(a.gpu, a.nic) for a in vm.nic_affinities if a.kind == topology_pb2.LINK_KIND_PIX}
    expected = {(vm_gpu[mapping[host_gpu_bus[g]]], f"pci-{mapping[host_nic_bus[n]]}") for g, n in host_pairs}
    assert vm_pairs == expected
    bridges = [attr for node in _walk(root) for attr in node.attributes if attr.name == "busid"]
    assert all(a.value.startswith("ffff:ff:") or a.value in mapping.values() for a in bridges)


def test_vm_file_names_an_unmapped_device(machine: Machine) -> None:
    host = machine("pcie-2socket-8gpu")
    with pytest.raises(ValueError, match=r"0000:99:00\.0"):
        vm_topology_file(host, bus_ids={"0000:99:00.0": "0001:00:00.0"})


def _walk(node):  # type: ignore[no-untyped-def]
    yield node
    for child in node.children:
        yield from _walk(child)


def test_a_dump_with_switches_nvswitch_links_and_nics() -> None:
    # The shape NCCL dumps on bare metal: CPU > PCIe switch > GPU (with NVLinks to NVSwitches) and NIC.
    text = """<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:07:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="80" rank="0" gdr="1">
          <nvlink target="0000:c7:00.0" count="6" tclass="0x068000"/>
          <nvlink target="0000:c8:00.0" count="6" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:0c:00.0" class="0x020000" link_speed="16.0 GT/s PCIe" link_width="16">
        <nic>
          <net name="mlx5_0" dev="0" speed="200000" port="1" latency="0.000000" guid="0xa262" maxconn="131072" gdr="1"/>
        </nic>
      </pci>
    </pci>
    <pci busid="0000:41:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:47:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="80" rank="1" gdr="1">
          <nvlink target="0000:c7:00.0" count="6" tclass="0x068000"/>
          <nvlink target="0000:c8:00.0" count="6" tclass="0x068000"/>
        </gpu>
      </pci>
    </pci>
  </cpu>
</system>
"""
    topo = read_nccl_topology(text, source="dgx.xml")
    (link,) = topo.gpu_links
    assert link.kind == topology_pb2.LINK_KIND_NVLINK and link.nvlink_count == 12 and link.via_nvswitch
    (nic,) = topo.nics
    assert nic.link_layer == topology_pb2.NIC_LINK_LAYER_ROCE and nic.rate_gbps == 200.0 and nic.gdr
    m = node_matrix(topo)
    assert (m.cell("GPU0", "NIC0"), m.cell("GPU1", "NIC0")) == ("PIX", "PHB")
    assert topo.gpus[0].pcie_gen_max == 4 and topo.gpus[0].cpu_affinity == "0-15"
    assert render_xml(topo.nccl_topology) == text
