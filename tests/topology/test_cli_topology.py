from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tests.topology.conftest import FIXTURES
from topo_tune.cli.main import cli


def test_show_reads_an_nccl_file_as_a_table() -> None:
    result = CliRunner().invoke(
        cli, ["topology", "show", "--nccl-xml", str(FIXTURES / "nccl-xml" / "azure-ndv5-topo.xml")]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "Node (unnamed)  [nccl-xml:azure-ndv5-topo.xml]"
    assert lines[2].split()[:10] == ["GPU0", "X", "PHB", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS", "PIX"]
    assert "Legend:" in result.output and "NIC Legend:" in result.output
    assert "Unknown (discovery could not tell):" in result.output
    assert lines[-1].startswith("Fingerprint: tf1-")


def test_show_json_carries_the_full_topology() -> None:
    path = FIXTURES / "h200-vm" / "nccl-topo-dump.xml"
    result = CliRunner().invoke(cli, ["topology", "show", "--nccl-xml", str(path), "--output", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["topology"]["gpus"][0]["pci_bus_id"] == "0000:00:06.0"
    assert data["topology"]["nccl_topology"]["tag"] == "system"
    assert data["fingerprint"].startswith("tf1-")


def test_show_names_the_line_of_a_broken_file(tmp_path: Path) -> None:
    bad = tmp_path / "topo.xml"
    bad.write_text('<system version="1">\n  <cpu numaid="0">\n    <pci busid="0000:01:00.0">\n  </cpu>\n</system>\n')
    result = CliRunner().invoke(cli, ["topology", "show", "--nccl-xml", str(bad)])
    assert result.exit_code == 1
    assert "topo.xml, line 4: mismatched tag" in result.output


def test_show_discovers_this_node_without_a_controller() -> None:
    result = CliRunner().invoke(cli, ["topology", "show", "--output", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["topology"]["source"] == "nvml+sysfs" and data["topology"]["hostname"]


def test_vm_file_prints_the_host_tree_under_vm_bus_ids(tmp_path: Path) -> None:
    host = FIXTURES / "nccl-xml" / "azure-ndv5-topo.xml"
    args = ["topology", "vm-file", "--host-xml", str(host), "--map", "0001:00:00.0=0000:00:06.0"]
    args += ["--map", "0101:00:00.0=0000:00:07.0"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    out = tmp_path / "vm.xml"
    out.write_text(result.output)
    shown = CliRunner().invoke(cli, ["topology", "show", "--nccl-xml", str(out)])
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if line.startswith("GPU0"))
    assert row.split()[:3] == ["GPU0", "X", "PIX"], "the GPU and its NIC still share a switch inside the VM"
    bad = CliRunner().invoke(cli, ["topology", "vm-file", "--host-xml", str(host), "--map", "0001:00:00.0"])
    assert bad.exit_code == 2 and "HOST_BUS_ID=VM_BUS_ID" in bad.output


def test_ring_orders_nodes_from_a_pair_file(tmp_path: Path) -> None:
    nodes = ["a1", "b1", "a2", "b2"]
    rack = {n: n[0] for n in nodes}
    bw = [[0.0 if x == y else (50.0 if rack[x] == rack[y] else 12.5) for y in nodes] for x in nodes]
    lat = [[0.0 if x == y else (3.0 if rack[x] == rack[y] else 5.0) for y in nodes] for x in nodes]
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps({"nodes": nodes, "bandwidth_gbps": bw, "latency_us": lat, "racks": rack, "slots": 8}))
    result = CliRunner().invoke(cli, ["topology", "ring", str(path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    order = data["planned"]["node_order"]
    assert order[0] == "a1" and data["world_size"] == 32
    assert sum(rack[order[i]] != rack[order[(i + 1) % 4]] for i in range(4)) == 2, "each rack visited once"
    assert data["planned"]["ring_latency_us"] < data["naive"]["ring_latency_us"]
    hostfile = CliRunner().invoke(cli, ["topology", "ring", str(path), "--output", "torchrun"])
    assert hostfile.output.splitlines()[1:] == [f"{n} {i}" for i, n in enumerate(order)]
    path.write_text(json.dumps({"nodes": nodes, "bandwidth_gbps": bw, "colour": 1}))
    bad = CliRunner().invoke(cli, ["topology", "ring", str(path)])
    assert bad.exit_code == 2 and "unknown key(s): colour" in bad.output
    bw[0][1] = 7.0
    path.write_text(json.dumps({"nodes": nodes, "bandwidth_gbps": bw}))
    asym = CliRunner().invoke(cli, ["topology", "ring", str(path)])
    assert asym.exit_code == 2 and "bandwidth[0][1]" in asym.output


def test_ring_keeps_each_block_of_a_pair_file_together(tmp_path: Path) -> None:
    # Four racks of two at one rate and latency everywhere across racks: only the tiers tell the blocks apart.
    nodes = [f"n{i}" for i in range(1, 9)]
    rack = {n: f"r{(int(n[1:]) + 1) // 2}" for n in nodes}
    block = {n: "A" if rack[n] in ("r1", "r3") else "B" for n in nodes}
    bw = [[0.0 if x == y else (50.0 if rack[x] == rack[y] else 12.5) for y in nodes] for x in nodes]
    path = tmp_path / "pairs.json"
    tiers = {n: ["spine-1", block[n]] for n in nodes}
    path.write_text(json.dumps({"nodes": nodes, "bandwidth_gbps": bw, "racks": rack, "tiers": tiers}))
    result = CliRunner().invoke(cli, ["topology", "ring", str(path)])
    assert result.exit_code == 0, result.output
    order = json.loads(result.stdout)["planned"]["node_order"]
    assert sum(block[order[i]] != block[order[i - 1]] for i in range(8)) == 2, order
    path.write_text(json.dumps({"nodes": nodes, "bandwidth_gbps": bw, "tiers": {"n1": "A"}}))
    bad = CliRunner().invoke(cli, ["topology", "ring", str(path)])
    assert bad.exit_code == 2 and '"tiers" must map each node to a list of tier names' in bad.output


def test_show_writes_a_read_file_back_as_nccl_xml() -> None:
    path = FIXTURES / "h200-x2-vm" / "nccl-topo-dump.xml"
    result = CliRunner().invoke(cli, ["topology", "show", "--nccl-xml", str(path), "--output", "nccl-xml"])
    assert result.exit_code == 0, result.output
    assert result.output == path.read_text()
