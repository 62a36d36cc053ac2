from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import json_format

from tests.topology.conftest import FIXTURES, MACHINES, replay
from topo_tune.agent.discovery import discover
from topo_tune.agent.discovery.nvml import NvmlAnswer, RecordingNvml, ReplayNvml
from topo_tune.agent.discovery.snapshot import load_snapshot, materialize, take_snapshot
from topo_tune.errors import NvmlCallError
from topo_tune.topology.matrix import node_matrix, parse_topo_m
from topo_tune.v1 import topology_pb2

Machine = Callable[[str], topology_pb2.NodeTopology]


@pytest.mark.parametrize("name", ["hgx-h100-8nic", "pcie-2socket-8gpu"])
def test_discovery_reproduces_the_published_nvidia_smi_matrix(machine: Machine, name: str) -> None:
    published = parse_topo_m((FIXTURES / name / "published-topo-m.txt").read_text())
    ours = node_matrix(machine(name))
    # The 2017 matrix names its one NIC by device ("mlx4_0") instead of NIC0.
    rename = {"mlx4_0": "NIC0"}
    names = [rename.get(n, n) for n in published.names]
    assert list(ours.names) == names
    for r, row in enumerate(published.names):
        for c, col in enumerate(published.names):
            assert ours.cell(names[r], names[c]) == published.cells[r][c], (row, col)
    assert ours.cpu_affinity == published.cpu_affinity
    if any(published.numa_affinity):
        assert ours.numa_affinity == published.numa_affinity
    if published.nic_legend:
        assert ours.nic_legend == published.nic_legend


def test_nvswitch_links_are_recognised_and_nics_read(machine: Machine) -> None:
    topo = machine("hgx-h100-8nic")
    assert len(topo.gpu_links) == 28
    assert all(link.via_nvswitch and link.nvlink_count == 18 for link in topo.gpu_links)
    assert [n.name for n in topo.nics] == [f"mlx5_{i}" for i in range(8)]
    for nic in topo.nics:
        assert nic.link_layer == topology_pb2.NIC_LINK_LAYER_INFINIBAND
        assert nic.rate_gbps == 400.0
        assert nic.port_state == "ACTIVE"
        assert nic.gdr is True  # nvidia_peermem is loaded in that tree
    assert topo.virtualized is False
    assert topo.numa_node_count == 2


def test_h200_reports_nvlink_and_numa_as_unknown_not_zero(machine: Machine) -> None:
    topo = machine("h200-vm")
    (gpu,) = topo.gpus
    assert gpu.name == "NVIDIA H200" and gpu.sm_arch == "sm_90"
    assert not gpu.HasField("numa_node"), "NUMA must stay unset (unknown), never 0"
    assert gpu.cpu_affinity == "0-15"
    assert gpu.pcie_gen_max == 5 and gpu.pcie_width_max == 16
    assert any("GPU0 NVLink" in u and "Not Supported" in u for u in topo.unknowns)
    assert any("GPU0 NUMA node" in u and "Not Supported" in u for u in topo.unknowns)
    assert topo.virtualized is True
    (eth,) = topo.nics
    assert eth.name == "eth0" and not eth.HasField("rate_gbps") and not eth.HasField("numa_node")
    # Same CPU affinity as the machine's own `nvidia-smi topo -m`.
    smi = parse_topo_m((FIXTURES / "h200-vm" / "nvidia-smi.txt").read_text())
    assert smi.cpu_affinity == ("0-15",)


@pytest.mark.parametrize("name", ["h200-vm", "h200-x2-vm"])
def test_replay_equals_what_the_real_pynvml_path_returned_on_the_device(machine: Machine, name: str) -> None:
    recorded = json_format.Parse(
        (FIXTURES / name / "discovered-on-device.json").read_text(), topology_pb2.NodeTopology()
    )
    replayed = machine(name)
    for topo in (recorded, replayed):
        topo.hostname = ""
        topo.versions.Clear()
        del topo.unknowns[:]
    assert replayed == recorded


def test_two_h200s_on_nvswitch_as_the_vm_reports_them(machine: Machine) -> None:
    # Recorded on a VM with two H200s: unlike the one-GPU VM, NVML answers the NVLink queries there.
    topo = machine("h200-x2-vm")
    assert [g.pci_bus_id for g in topo.gpus] == ["0000:00:06.0", "0000:00:07.0"]
    [link] = topo.gpu_links
    assert (link.gpu_a, link.gpu_b, link.nvlink_count) == (0, 1, 18)
    assert link.via_nvswitch, "the links end on an NVSwitch (NCCL's dump: nvlink target class 0x068000)"
    assert link.p2p_read == link.p2p_write == topology_pb2.P2P_STATUS_OK
    ours = node_matrix(topo)
    smi = parse_topo_m((FIXTURES / "h200-x2-vm" / "nvidia-smi.txt").read_text())
    assert [[ours.cell(a, b) for b in smi.names] for a in smi.names] == [list(row) for row in smi.cells]
    assert ours.cpu_affinity == smi.cpu_affinity == ("0-31", "0-31")
    # nvidia-smi prints NUMA affinity 0 next to "GPU NUMA ID N/A"; NVML and sysfs say unknown, and so do we.
    assert all(not g.HasField("numa_node") for g in topo.gpus)
    assert any("GPU1 NUMA node" in u and "Not Supported" in u for u in topo.unknowns)
    assert topo.virtualized is True


def test_every_fixture_answers_every_question_discovery_asks(tmp_path: Path) -> None:
    for name in MACHINES:
        _, nvml = replay(name, tmp_path / name)
        assert nvml.missing == [], name


@pytest.mark.parametrize("name", ["pcie-2socket-8gpu", "dual-port-hca"])
def test_recording_then_replaying_gives_the_same_topology(tmp_path: Path, name: str) -> None:
    source = ReplayNvml.load(FIXTURES / name / "nvml.json")
    root = materialize(load_snapshot(FIXTURES / name / "sysfs.json"), tmp_path / "a")
    recorder = RecordingNvml(source)
    first = discover(nvml=recorder, sysfs_root=root, hostname="n", nccl_version=lambda: None)  # type: ignore[arg-type]
    recorder.save(tmp_path / "nvml.json")
    (tmp_path / "sysfs.json").write_text(json.dumps(take_snapshot(root)))
    again_root = materialize(load_snapshot(tmp_path / "sysfs.json"), tmp_path / "b")
    again = discover(
        nvml=ReplayNvml.load(tmp_path / "nvml.json"), sysfs_root=again_root, hostname="n", nccl_version=lambda: None
    )
    assert again == first


class _BrokenNvml(ReplayNvml):
    def __init__(self) -> None:
        super().__init__([])

    def __getattr__(self, method: str):  # type: ignore[no-untyped-def]
        def call(*args: int) -> object:
            if method == "init":
                raise NvmlCallError("nvmlInit", 9, "Driver Not Loaded")
            raise AssertionError("no call after a failed init")

        return call


def test_nvml_failure_leaves_gpus_unknown_but_keeps_the_rest(tmp_path: Path) -> None:
    root = materialize(load_snapshot(FIXTURES / "hgx-h100-8nic" / "sysfs.json"), tmp_path)
    topo = discover(nvml=_BrokenNvml(), sysfs_root=root, hostname="n", nccl_version=lambda: None)  # type: ignore[arg-type]
    assert not topo.gpus
    assert "GPUs: NVML could not start (Driver Not Loaded)" in topo.unknowns
    assert len(topo.nics) == 8


def test_discovery_never_raises_even_when_everything_is_missing(tmp_path: Path) -> None:
    def boom() -> str | None:
        raise OSError("libnccl exploded")

    topo = discover(nvml=_BrokenNvml(), sysfs_root=tmp_path / "nothing", hostname="n", nccl_version=boom)  # type: ignore[arg-type]
    assert topo.cpu_count == 0 and not topo.HasField("numa_node_count") and not topo.HasField("virtualized")
    assert any("CPU count" in u for u in topo.unknowns)
    assert any("NCCL version" in u for u in topo.unknowns)


def test_discover_takes_no_arguments_on_a_real_machine() -> None:
    topo = discover()  # this machine: real pynvml (or its absence) and the real /sys
    assert isinstance(topo, topology_pb2.NodeTopology)
    assert topo.hostname
    if not topo.gpus:
        assert any(u.startswith("GPUs:") for u in topo.unknowns)


def _two_gpu_answers(remote_type: int | None) -> list[NvmlAnswer]:
    """Two GPUs joined by two NVLinks (an NVLink bridge), as NVML would answer."""
    answers = [
        NvmlAnswer("init", ()),
        NvmlAnswer("device_count", (), 2),
        NvmlAnswer("pci_bus_id", (0,), "00000000:17:00.0"),
        NvmlAnswer("pci_bus_id", (1,), "00000000:65:00.0"),
    ]
    peers = {0: "00000000:65:00.0", 1: "00000000:17:00.0"}
    for gpu in (0, 1):
        for link in (0, 1):
            answers += [
                NvmlAnswer("nvlink_state", (gpu, link), 1),
                NvmlAnswer("nvlink_p2p_supported", (gpu, link), 1),
                NvmlAnswer("nvlink_remote_bus_id", (gpu, link), peers[gpu]),
            ]
            if remote_type is None:
                answers.append(
                    NvmlAnswer("nvlink_remote_device_type", (gpu, link), error_code=3, error_message="Not Supported")
                )
            else:
                answers.append(NvmlAnswer("nvlink_remote_device_type", (gpu, link), remote_type))
        answers.append(NvmlAnswer("nvlink_state", (gpu, 2), error_code=2, error_message="Invalid Argument"))
    answers += [NvmlAnswer("p2p_status", (0, 1, caps), 0) for caps in (0, 1)]
    return answers


@pytest.mark.parametrize("remote_type", [0, None], ids=["typed", "type-unknown"])
def test_direct_nvlinks_are_counted_per_peer(tmp_path: Path, remote_type: int | None) -> None:
    nvml = ReplayNvml(_two_gpu_answers(remote_type))
    topo = discover(nvml=nvml, sysfs_root=tmp_path, hostname="n", nccl_version=lambda: None)
    (link,) = topo.gpu_links
    assert link.kind == topology_pb2.LINK_KIND_NVLINK and link.nvlink_count == 2 and not link.via_nvswitch
    assert link.p2p_read == link.p2p_write == topology_pb2.P2P_STATUS_OK
    assert node_matrix(topo).cell("GPU0", "GPU1") == "NV2"


def test_cpu_affinity_mask_covers_cpu_ids_beyond_the_online_count(tmp_path: Path) -> None:
    # 8 CPUs online, but with ids up to 131 (the rest offline): NVML needs a 3-word mask.
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3,128-131\n")
    answers = [
        NvmlAnswer("init", ()),
        NvmlAnswer("device_count", (), 1),
        NvmlAnswer("cpu_affinity", (0, 3), [0xF, 0, 0xF]),
    ]
    topo = discover(nvml=ReplayNvml(answers), sysfs_root=tmp_path, hostname="n", nccl_version=lambda: None)
    assert topo.cpu_count == 8
    assert topo.gpus[0].cpu_affinity == "0-3,128-131"
