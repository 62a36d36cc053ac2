"""Node discovery: what this machine is, as a ``NodeTopology``.

Basic discovery: host, CPUs, memory, NICs from ``/sys/class/net``, GPUs through NVML when present. It never
raises: whatever cannot be read is recorded in ``unknowns`` and left unset, never guessed or zeroed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
from pathlib import Path

from topo_tune import __version__
from topo_tune.v1 import topology_pb2

logger = logging.getLogger(__name__)


def _memory_bytes(proc: Path) -> int | None:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _nics(sys_root: Path, topology: topology_pb2.NodeTopology) -> None:
    net = sys_root / "class" / "net"
    try:
        names = sorted(p.name for p in net.iterdir())
    except OSError:
        topology.unknowns.append("network interfaces: /sys/class/net unreadable")
        return
    for name in names:
        if name == "lo":
            continue
        nic = topology.nics.add(name=name, link_layer=topology_pb2.NIC_LINK_LAYER_ETHERNET)
        with contextlib.suppress(OSError):
            nic.port_state = (net / name / "operstate").read_text().strip()
        try:
            speed = int((net / name / "speed").read_text().strip())
            if speed > 0:
                nic.rate_gbps = speed / 1000
        except (OSError, ValueError):
            pass


def _gpus(topology: topology_pb2.NodeTopology) -> None:
    try:
        import pynvml  # noqa: PLC0415 - optional: only GPU nodes have the NVML library

        pynvml.nvmlInit()
    except Exception as error:
        topology.unknowns.append(f"GPUs: NVML unavailable ({error.__class__.__name__})")
        return
    try:
        topology.versions.driver = str(pynvml.nvmlSystemGetDriverVersion())
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu = topology.gpus.add(
                index=index,
                uuid=str(pynvml.nvmlDeviceGetUUID(handle)),
                name=str(pynvml.nvmlDeviceGetName(handle)),
                pci_bus_id=str(pynvml.nvmlDeviceGetPciInfo(handle).busId).lower(),
            )
            gpu.memory_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception as error:
        topology.unknowns.append(f"GPUs: NVML query failed ({error})")
    finally:
        pynvml.nvmlShutdown()


def discover(*, sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> topology_pb2.NodeTopology:
    """Discover this node. Never raises."""
    topology = topology_pb2.NodeTopology(hostname=socket.gethostname(), cpu_count=os.cpu_count() or 0)
    memory = _memory_bytes(proc_root)
    if memory is None:
        topology.unknowns.append("memory: /proc/meminfo unreadable")
    else:
        topology.memory_bytes = memory
    topology.versions.topo_tune = __version__
    topology.versions.kernel = platform.release()
    topology.cpu_model = platform.processor()
    _nics(sys_root, topology)
    _gpus(topology)
    return topology
