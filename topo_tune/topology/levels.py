"""The link vocabulary of `nvidia-smi topo -m`, and how it maps to NVML and NCCL.

Purpose: one place that turns a `LinkKind` into the label an operator knows (``NV18``, ``PIX`` ...), that maps
NVML's PCIe common-ancestor levels onto it, and that holds the legend. Non-goals: deciding a link (discovery and
the PCI-path model do that).
"""

from __future__ import annotations

from topo_tune.v1 import topology_pb2

LinkKind = topology_pb2.LinkKind

# NVML's nvmlGpuTopologyLevel_t. It is PCIe-only: it never says anything about NVLink.
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

_NVML_LEVEL_TO_KIND: dict[int, topology_pb2.LinkKind.ValueType] = {
    # A dual-GPU board has its own PCIe switch, which nvidia-smi prints as PIX.
    NVML_TOPOLOGY_INTERNAL: topology_pb2.LINK_KIND_PIX,
    NVML_TOPOLOGY_SINGLE: topology_pb2.LINK_KIND_PIX,
    NVML_TOPOLOGY_MULTIPLE: topology_pb2.LINK_KIND_PXB,
    NVML_TOPOLOGY_HOSTBRIDGE: topology_pb2.LINK_KIND_PHB,
    NVML_TOPOLOGY_NODE: topology_pb2.LINK_KIND_NODE,
    NVML_TOPOLOGY_SYSTEM: topology_pb2.LINK_KIND_SYS,
}

_LABELS: dict[int, str] = {
    topology_pb2.LINK_KIND_SELF: "X",
    topology_pb2.LINK_KIND_PIX: "PIX",
    topology_pb2.LINK_KIND_PXB: "PXB",
    topology_pb2.LINK_KIND_PHB: "PHB",
    topology_pb2.LINK_KIND_NODE: "NODE",
    topology_pb2.LINK_KIND_SYS: "SYS",
    topology_pb2.LINK_KIND_UNKNOWN: "?",
    topology_pb2.LINK_KIND_UNSPECIFIED: "?",
}
_FROM_LABEL: dict[str, int] = {label: kind for kind, label in _LABELS.items() if label != "?"}

# Closeness order for PCIe levels (lower is closer); NVLink is closest of all.
_RANK: dict[int, int] = {
    topology_pb2.LINK_KIND_SELF: 0,
    topology_pb2.LINK_KIND_NVLINK: 1,
    topology_pb2.LINK_KIND_PIX: 2,
    topology_pb2.LINK_KIND_PXB: 3,
    topology_pb2.LINK_KIND_PHB: 4,
    topology_pb2.LINK_KIND_NODE: 5,
    topology_pb2.LINK_KIND_SYS: 6,
}

LEGEND: tuple[tuple[str, str], ...] = (
    ("X", "Self"),
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
    (
        "NODE",
        "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    ),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("NV#", "Connection traversing a bonded set of # NVLinks"),
    ("?", "Unknown: discovery could not tell"),
)


def kind_from_nvml_level(level: int) -> topology_pb2.LinkKind.ValueType:
    """Map an NVML common-ancestor level to a `LinkKind`; an unheard-of level is UNKNOWN, not a guess."""
    return _NVML_LEVEL_TO_KIND.get(level, topology_pb2.LINK_KIND_UNKNOWN)


def link_label(kind: int, nvlink_count: int | None = None) -> str:
    """The `nvidia-smi topo -m` cell for a link: ``NV18`` for 18 bonded NVLinks, ``PIX`` ..., ``?`` unknown."""
    if kind == topology_pb2.LINK_KIND_NVLINK:
        return f"NV{nvlink_count}" if nvlink_count is not None else "NV?"
    return _LABELS.get(kind, "?")


def kind_from_label(label: str) -> tuple[int, int | None]:
    """Parse a matrix cell back into (kind, nvlink_count); raises ValueError naming the cell."""
    text = label.strip()
    if text.startswith("NV") and text[2:].isdigit():
        return topology_pb2.LINK_KIND_NVLINK, int(text[2:])
    if text in _FROM_LABEL:
        return _FROM_LABEL[text], None
    if text == "?":
        return topology_pb2.LINK_KIND_UNKNOWN, None
    raise ValueError(f"unknown topology cell {label!r}")


def closeness(kind: int) -> int:
    """Rank for comparing levels (lower = closer); UNKNOWN sorts last."""
    return _RANK.get(kind, 99)


def nccl_path_type(kind: int) -> str:
    """The NCCL path string (`NCCL_P2P_LEVEL` vocabulary) for a link kind; NODE is PHB to NCCL."""
    if kind == topology_pb2.LINK_KIND_NVLINK:
        return "NVL"
    if kind == topology_pb2.LINK_KIND_NODE:
        return "PHB"
    if kind == topology_pb2.LINK_KIND_SELF:
        return "LOC"
    if kind in (topology_pb2.LINK_KIND_PIX, topology_pb2.LINK_KIND_PXB, topology_pb2.LINK_KIND_PHB):
        return _LABELS[kind]
    # SYS, and an unknown path: NCCL must not be told a path is closer than we know it to be.
    return "SYS"
