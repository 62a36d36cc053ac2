"""PCI paths and the `nvidia-smi topo -m` level between two devices.

Purpose: from two devices' places in the PCI tree (sysfs realpaths, or paths built from an NCCL topology XML),
and their NUMA nodes, decide PIX / PXB / PHB / NODE / SYS by the deepest common ancestor, the way nvidia-smi and
NCCL do. Non-goals: reading sysfs (discovery does that) and NVLink (never visible in the PCI tree).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topo_tune.v1 import topology_pb2

_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
NCCL_PATH_PREFIX = "nccl:"


def normalize_bus_id(bus_id: str) -> str:
    """NVML says ``00000000:1B:00.0``, sysfs ``0000:1b:00.0``: use the sysfs form (lower case, 4-digit domain)."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    if len(domain) > 4 and domain.startswith("0000"):
        domain = domain[-4:]
    return f"{domain}:{rest}"


@dataclass(frozen=True)
class PciPath:
    """A device's path in the PCI tree: a root (host bridge / root complex) and the devices below it.

    ``root`` is ``pci0000:00`` for sysfs paths and ``cpu<numaid>`` for NCCL XML paths; ``chain`` lists the
    bridges from the root port down to the device itself (the last element).
    """

    root: str
    chain: tuple[str, ...]

    @property
    def device(self) -> str:
        return self.chain[-1] if self.chain else ""

    def render(self) -> str:
        if self.root.startswith("cpu"):
            return NCCL_PATH_PREFIX + "/".join((self.root, *self.chain))
        return "/sys/devices/" + "/".join((self.root, *self.chain))


def parse_pci_path(text: str) -> PciPath | None:
    """Parse a stored ``pci_path``; None for empty or unrecognisable text (unknown, not an error)."""
    if not text:
        return None
    if text.startswith(NCCL_PATH_PREFIX):
        parts = [p for p in text[len(NCCL_PATH_PREFIX) :].split("/") if p]
        if len(parts) < 2:
            return None
        return PciPath(root=parts[0], chain=tuple(parts[1:]))
    parts = [p for p in text.split("/") if p]
    # Find the root complex component ("pci0000:00"); what follows are BDFs until a non-BDF component.
    for index, part in enumerate(parts):
        if part.startswith("pci") and ":" in part:
            chain: list[str] = []
            for comp in parts[index + 1 :]:
                if not _BDF.match(comp):
                    break
                chain.append(comp)
            if not chain:
                return None
            return PciPath(root=part, chain=tuple(chain))
    return None


def pcie_level(
    a: PciPath | None,
    b: PciPath | None,
    *,
    numa_a: int | None,
    numa_b: int | None,
) -> topology_pb2.LinkKind.ValueType:
    """The `LinkKind` between two devices by their deepest common PCI ancestor.

    Same root complex: PIX when at most one bridge (a PCIe switch counts as one) separates them, PXB when more,
    PHB when the paths only meet at the host bridge. Different roots: NODE on one NUMA node, SYS across nodes;
    UNKNOWN when a path or a needed NUMA node is unknown, never a guess.
    """
    if a is None or b is None:
        return topology_pb2.LINK_KIND_UNKNOWN
    if a.root != b.root:
        if numa_a is None or numa_b is None:
            return topology_pb2.LINK_KIND_UNKNOWN
        return topology_pb2.LINK_KIND_NODE if numa_a == numa_b else topology_pb2.LINK_KIND_SYS
    common = 0
    for x, y in zip(a.chain, b.chain, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return topology_pb2.LINK_KIND_PHB
    below_a = len(a.chain) - common
    below_b = len(b.chain) - common
    # Below a switch's upstream port come one downstream port and the device: two hops each side.
    if max(below_a, below_b) <= 2:
        return topology_pb2.LINK_KIND_PIX
    return topology_pb2.LINK_KIND_PXB
