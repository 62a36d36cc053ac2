"""How NCCL names, groups and numbers the ports of RDMA devices.

Purpose: one place for NCCL's rules about NIC endpoints, shared by discovery and the NCCL topology XML reader
and writer. NCCL's IB transport (net_ib) opens every ACTIVE port of every device as its own net device and lists
them as ``[0]mlx5_0:1 [1]mlx5_0:2``; it folds the PCI functions of one card (and its virtual functions) onto
function 0 of the device, so every port of a dual-port card sits under one ``<pci>``/``<nic>`` in its topology
XML; and it reports each endpoint's ``port`` as the device's own port number plus the count of endpoints listed
before it on the same folded PCI device ("realPort"), after sorting endpoints by PCI address
(NCCL_IB_DEVICE_PCI_ORDER=1, the default). Non-goals: NCCL's virtual-NIC fusion (NCCL_NET_MERGE_LEVEL).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


def endpoint_name(device: str, port: int | None, *, active_ports: int) -> str:
    """An endpoint's name: the device alone when it is the device's only active port, else ``device:port``, as
    NCCL_IB_HCA and NCCL's "NET/IB : Using" line spell one port."""
    return f"{device}:{port}" if active_ports > 1 and port is not None else device


def folded_bus_id(bus_id: str) -> str:
    """The PCI device NCCL files an RDMA device under: function (and, with NCCL_IB_MERGE_VFS=1, the default,
    device) digits set to 0, so ``0000:3b:00.1`` (a dual-port card's second port) becomes ``0000:3b:00.0``."""
    if len(bus_id) < 4 or bus_id[-2] != ".":
        return bus_id
    return bus_id[:-4] + "00.0"


@dataclass(frozen=True)
class NcclPort:
    """Where NCCL lists one endpoint: its net device index (``dev=``) and its ``port=`` attribute."""

    dev: int
    port: int


@dataclass(frozen=True)
class Endpoint:
    """What the numbering needs to know of one RDMA endpoint."""

    name: str
    bus_id: str  # the device's own PCI function, "0000:3b:00.1"
    port: int  # the device's port number, from 1


def nccl_ports(endpoints: Sequence[Endpoint]) -> dict[str, NcclPort]:
    """NCCL's ``dev`` and ``port`` for each endpoint, by name: endpoints sorted by PCI address, then port; port =
    the device's port + how many endpoints before it share its folded PCI device."""
    ordered = sorted(endpoints, key=lambda e: (_bus_key(e.bus_id), e.port, e.name))
    seen: Counter[str] = Counter()
    out: dict[str, NcclPort] = {}
    for dev, endpoint in enumerate(ordered):
        folded = folded_bus_id(endpoint.bus_id)
        out[endpoint.name] = NcclPort(dev=dev, port=endpoint.port + seen[folded])
        seen[folded] += 1
    return out


def device_ports(nccl_port_numbers: Sequence[int]) -> list[int]:
    """The inverse for the endpoints of one folded PCI device, in NCCL's order: each one's own port number."""
    return [number - real_port for real_port, number in enumerate(nccl_port_numbers)]


def _bus_key(bus_id: str) -> tuple[int, ...]:
    parts = bus_id.replace(".", ":").split(":")
    try:
        return tuple(int(part, 16) for part in parts)
    except ValueError:
        return (1 << 32,)  # an unreadable address sorts last, as NCCL puts a device without a path last


__all__ = ["Endpoint", "NcclPort", "device_ports", "endpoint_name", "folded_bus_id", "nccl_ports"]
