"""Shared fixtures: replay a recorded or published machine through the real discovery code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from topo_tune.agent.discovery import discover
from topo_tune.agent.discovery.nvml import ReplayNvml
from topo_tune.agent.discovery.snapshot import load_snapshot, materialize
from topo_tune.v1 import topology_pb2

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "topology"
MACHINES = ("h200-vm", "h200-x2-vm", "hgx-h100-8nic", "pcie-2socket-8gpu", "dual-port-hca")


def replay(name: str, root: Path) -> tuple[topology_pb2.NodeTopology, ReplayNvml]:
    nvml = ReplayNvml.load(FIXTURES / name / "nvml.json")
    materialize(load_snapshot(FIXTURES / name / "sysfs.json"), root)
    topo = discover(nvml=nvml, sysfs_root=root, hostname=name, nccl_version=lambda: None)
    return topo, nvml


@pytest.fixture
def machine(tmp_path: Path) -> Callable[[str], topology_pb2.NodeTopology]:
    def load(name: str) -> topology_pb2.NodeTopology:
        topo, nvml = replay(name, tmp_path / name)
        assert nvml.missing == [], f"{name}: discovery asked NVML questions the fixture never recorded"
        return topo

    return load
