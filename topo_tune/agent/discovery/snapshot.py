"""Recorded sysfs/procfs trees: take a snapshot of the files discovery reads, and lay one out again.

Purpose: fixtures for discovery come from real machines. `take_snapshot` copies exactly the files and links
discovery looks at (PCI devices, NICs, NUMA, CPU and memory facts) into a JSON-able mapping; `materialize` writes
it below a directory that discovery then reads as its ``sysfs_root``. Non-goals: a general sysfs copier.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

_PCI_FILES = (
    "numa_node",
    "local_cpulist",
    "class",
    "vendor",
    "device",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
)
_NET_FILES = ("operstate", "speed", "type", "mtu")
_PORT_FILES = ("state", "phys_state", "rate", "link_layer")
_HOST_FILES = (
    "sys/devices/system/cpu/online",
    "sys/devices/system/node/online",
    "sys/class/dmi/id/sys_vendor",
    "sys/class/dmi/id/product_name",
    "sys/kernel/mm/memory_peers/nv_mem/version",
    "proc/cpuinfo",
    "proc/meminfo",
    "proc/sys/kernel/osrelease",
)
_HOST_DIRS = ("sys/module/nvidia_peermem", "sys/module/nv_peer_mem")
_MAX_GIDS = 16


class _Taker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, str] = {}
        self.links: dict[str, str] = {}
        self.dirs: set[str] = set()

    def _abs(self, rel: str) -> Path:
        return self.root / rel

    def rel_real(self, rel: str) -> str | None:
        path = self._abs(rel)
        if not path.exists():
            return None
        return os.path.relpath(os.path.realpath(path), os.path.realpath(self.root))

    def file(self, rel: str) -> None:
        # Unreadable files stay absent, exactly as discovery would find them.
        with contextlib.suppress(OSError):
            self.files[rel] = self._abs(rel).read_text(errors="replace")

    def link(self, rel: str) -> str | None:
        path = self._abs(rel)
        if not path.is_symlink():
            return None
        self.links[rel] = os.readlink(path)
        return self.rel_real(rel)

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self._abs(rel)))
        except OSError:
            return []

    def pci_device(self, real: str) -> None:
        """Record a PCI function and every PCI ancestor up to the root complex."""
        parts = real.split("/")
        for end in range(len(parts), 0, -1):
            component = parts[end - 1]
            if component.startswith("pci"):
                self.dirs.add("/".join(parts[:end]))
                break
            if component.count(":") != 2:
                continue
            base = "/".join(parts[:end])
            self.dirs.add(base)
            for name in _PCI_FILES:
                self.file(f"{base}/{name}")


def take_snapshot(root: Path = Path("/")) -> dict[str, Any]:
    """Copy what discovery reads below ``root`` into ``{"files": ..., "links": ..., "dirs": ...}``."""
    t = _Taker(root)
    for rel in _HOST_FILES:
        t.file(rel)
    for rel in _HOST_DIRS:
        if t._abs(rel).is_dir():
            t.dirs.add(rel)
    for node in t.listdir("sys/devices/system/node"):
        if node.startswith("node") and node[4:].isdigit():
            t.file(f"sys/devices/system/node/{node}/cpulist")
    for bdf in t.listdir("sys/bus/pci/devices"):
        real = t.link(f"sys/bus/pci/devices/{bdf}")
        if real:
            t.pci_device(real)
    for dev in t.listdir("sys/class/net"):
        real = t.link(f"sys/class/net/{dev}")
        if real is None:
            continue
        t.dirs.add(real)
        for name in _NET_FILES:
            t.file(f"{real}/{name}")
        device = t.link(f"{real}/device")
        if device:
            t.dirs.add(device)
    for hca in t.listdir("sys/class/infiniband"):
        real = t.link(f"sys/class/infiniband/{hca}")
        if real is None:
            continue
        t.dirs.add(real)
        device = t.link(f"{real}/device")
        if device:
            for netdev in t.listdir(f"{device}/net"):
                t.dirs.add(f"{device}/net/{netdev}")
                # Which port a netdev serves, on devices with several.
                t.file(f"{device}/net/{netdev}/dev_port")
        for port in t.listdir(f"{real}/ports"):
            pbase = f"{real}/ports/{port}"
            t.dirs.add(pbase)
            for name in _PORT_FILES:
                t.file(f"{pbase}/{name}")
            for gid in t.listdir(f"{pbase}/gid_attrs/types")[:_MAX_GIDS]:
                t.file(f"{pbase}/gid_attrs/types/{gid}")
    return {
        "files": dict(sorted(t.files.items())),
        "links": dict(sorted(t.links.items())),
        "dirs": sorted(t.dirs),
    }


def materialize(snapshot: dict[str, Any], dest: Path) -> Path:
    """Lay a snapshot out below ``dest`` (links stay relative, so they resolve inside ``dest``)."""
    for rel in snapshot.get("dirs", []):
        (dest / rel).mkdir(parents=True, exist_ok=True)
    for rel, text in snapshot.get("files", {}).items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel, target in snapshot.get("links", {}).items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_symlink():
            os.symlink(target, path)
    return dest


def load_snapshot(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
