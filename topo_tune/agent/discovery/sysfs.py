"""The sysfs/procfs edge of discovery: NICs, PCI paths, NUMA nodes and host facts read below a root path.

Purpose: everything discovery learns from files, read below ``root`` (``/`` on a real machine, a recorded tree in
tests), with "could not read" kept distinct from any value. Non-goals: NVML; deciding PCIe levels (see
`topo_tune.topology.pci`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SysfsNic:
    """One network device as sysfs describes it; None / "" = the file was missing or unreadable."""

    name: str
    rdma: bool
    link_layer: str  # "InfiniBand", "Ethernet" (RDMA) or "" for a plain netdev
    port_state: str
    rate_gbps: float | None
    gid_types: tuple[str, ...]
    pci_path: str
    pci_bus_id: str
    numa_node: int | None
    netdevs: tuple[str, ...] = field(default_factory=tuple)
    port: int | None = None  # RDMA port number (sysfs ports/<n>, as ibverbs counts: from 1)
    ports_on_device: int = 0  # how many ports the RDMA device has in sysfs
    phys_state: str = ""  # "LinkUp", "Polling", "Disabled": why a port is not ACTIVE


class Sysfs:
    """Reads below a root directory; every reader returns None when the file cannot be read."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str) -> str | None:
        try:
            return self._path(rel).read_text(errors="replace").strip()
        except OSError:
            return None

    def read_int(self, rel: str) -> int | None:
        text = self.read(rel)
        if text is None:
            return None
        try:
            return int(text.split()[0], 0)
        except (ValueError, IndexError):
            return None

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(rel)))
        except OSError:
            return []

    def exists(self, rel: str) -> bool:
        return self._path(rel).exists()

    def realpath(self, rel: str) -> str | None:
        """The resolved path of a sysfs link, as it reads on the machine ("/sys/devices/...")."""
        path = self._path(rel)
        if not path.exists():
            return None
        resolved = os.path.realpath(path)
        root = os.path.realpath(self.root)
        if root != "/" and resolved.startswith(root):
            resolved = resolved[len(root) :] or "/"
        return resolved

    # --- PCI devices -------------------------------------------------------------------------------------
    def pci_path(self, bus_id: str) -> str | None:
        return self.realpath(f"sys/bus/pci/devices/{bus_id}")

    def pci_numa_node(self, bus_id: str) -> int | None:
        value = self.read_int(f"sys/bus/pci/devices/{bus_id}/numa_node")
        # The kernel writes -1 when the firmware gave no NUMA information (always so in many VMs).
        return value if value is not None and value >= 0 else None

    def pci_local_cpulist(self, bus_id: str) -> str | None:
        return self.read(f"sys/bus/pci/devices/{bus_id}/local_cpulist") or None

    # --- host ----------------------------------------------------------------------------------------------
    def cpuinfo(self) -> str | None:
        return self.read("proc/cpuinfo")

    def meminfo_total_bytes(self) -> int | None:
        text = self.read("proc/meminfo")
        if text is None:
            return None
        for line in text.splitlines():
            if line.startswith("MemTotal:"):
                parts = line.split()
                try:
                    return int(parts[1]) * 1024
                except (IndexError, ValueError):
                    return None
        return None

    # --- NICs ----------------------------------------------------------------------------------------------
    def rdma_ports(self) -> list[SysfsNic]:
        """Every port of every RDMA device, active or not, in device then port order (deciding which count is
        discovery's job). A device without a readable ports/ directory gives one entry with port None."""
        out = []
        for hca in self.listdir("sys/class/infiniband"):
            base = f"sys/class/infiniband/{hca}"
            pci_path = self.realpath(f"{base}/device") or ""
            bus_id = os.path.basename(pci_path) if pci_path else ""
            numa = self.pci_numa_node(bus_id) if bus_id else None
            netdevs = self._netdevs_by_port(f"{base}/device/net")
            ports = sorted((p for p in self.listdir(f"{base}/ports") if p.isdigit()), key=int) or [""]
            for port in ports:
                pbase = f"{base}/ports/{port}"
                state = self.read(f"{pbase}/state") or ""
                phys = self.read(f"{pbase}/phys_state") or ""
                gid_types: set[str] = set()
                for gid in self.listdir(f"{pbase}/gid_attrs/types"):
                    value = self.read(f"{pbase}/gid_attrs/types/{gid}")
                    if value:
                        gid_types.add(value)
                number = int(port) if port else None
                out.append(
                    SysfsNic(
                        name=hca,
                        rdma=True,
                        link_layer=self.read(f"{pbase}/link_layer") or "",
                        # "4: ACTIVE" / "5: LinkUp": the kernel prefixes the ibverbs enum value.
                        port_state=state.split(":", 1)[-1].strip(),
                        rate_gbps=_parse_ib_rate(self.read(f"{pbase}/rate")),
                        gid_types=tuple(sorted(gid_types)),
                        pci_path=pci_path,
                        pci_bus_id=bus_id,
                        numa_node=numa,
                        netdevs=tuple(name for name, on in netdevs if on is None or on == number),
                        port=number,
                        ports_on_device=len(ports) if port else 0,
                        phys_state=phys.split(":", 1)[-1].strip(),
                    )
                )
        return out

    def _netdevs_by_port(self, rel: str) -> list[tuple[str, int | None]]:
        """Netdevs of a device with the port each serves: ``dev_port`` counts from 0 (ibverbs from 1); None when
        the kernel does not say, and then the netdev is listed with every port."""
        out = []
        for netdev in self.listdir(rel):
            dev_port = self.read_int(f"{rel}/{netdev}/dev_port")
            out.append((netdev, dev_port + 1 if dev_port is not None and dev_port >= 0 else None))
        return out

    def ethernet_nics(self, *, exclude: set[str]) -> list[SysfsNic]:
        nics = []
        for dev in self.listdir("sys/class/net"):
            if dev in exclude or dev == "lo":
                continue
            resolved = self.realpath(f"sys/class/net/{dev}") or ""
            if "/virtual/" in resolved:
                continue  # bridges, veths, tunnels: no hardware behind them
            device = self.realpath(f"sys/class/net/{dev}/device") or ""
            pci_path, bus_id = "", ""
            # A virtio NIC's "device" is the virtio node under its PCI function; walk up to the PCI function.
            parts = device.split("/")
            for index in range(len(parts) - 1, -1, -1):
                if parts[index].count(":") == 2 and "." in parts[index]:
                    pci_path = "/".join(parts[: index + 1])
                    bus_id = parts[index]
                    break
            speed = self.read_int(f"sys/class/net/{dev}/speed")
            nics.append(
                SysfsNic(
                    name=dev,
                    rdma=False,
                    link_layer="",
                    port_state=self.read(f"sys/class/net/{dev}/operstate") or "",
                    # The kernel reports -1 (or refuses the read) when the driver does not know the speed.
                    rate_gbps=speed / 1000.0 if speed is not None and speed > 0 else None,
                    gid_types=(),
                    pci_path=pci_path,
                    pci_bus_id=bus_id,
                    numa_node=self.pci_numa_node(bus_id) if bus_id else None,
                )
            )
        return nics

    def gdr_driver_loaded(self) -> bool:
        """nvidia_peermem (or the older nv_peer_mem) registers itself here when loaded."""
        return (
            self.exists("sys/module/nvidia_peermem")
            or self.exists("sys/kernel/mm/memory_peers/nv_mem/version")
            or self.exists("sys/module/nv_peer_mem")
        )


def _parse_ib_rate(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0."""
    if not text:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None
