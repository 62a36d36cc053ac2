"""Read what ``NCCL_TOPO_DUMP_FILE`` writes into the `NodeTopology` discovery produces.

Purpose: NCCL's own view of a node (`<cpu>` / `<pci>` / `<gpu>` / `<nvlink>` / `<nic>` / `<net>`) as GPUs,
NICs with their ports, GPU links and NIC affinities, keeping the element tree itself for a lossless
write-back, and listing what the file does not record. Malformed files raise `NcclXmlError` naming the line.

Non-goals: writing a file NCCL reads (``nccl_topo_file``); probing the hardware (the agent's discovery).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from topo_tune.errors import NcclXmlError
from topo_tune.topology.cpulist import cpulist_from_hex_mask
from topo_tune.topology.nccl_xml import ETH_CLASS, GPU_CLASSES, IB_CLASS, NVSWITCH_CLASS, XmlNode, attr, parse_xml
from topo_tune.topology.nic_ports import device_ports, endpoint_name
from topo_tune.topology.pci import PciPath, parse_pci_path, pcie_level
from topo_tune.v1 import topology_pb2

# PCIe transfer rate per lane to generation.
_GEN_BY_RATE = {"2.5": 1, "5.0": 2, "5": 2, "8.0": 3, "8": 3, "16.0": 4, "16": 4, "32.0": 5, "32": 5, "64.0": 6}


def _int_attr(element: XmlNode, name: str, *, source: str) -> int:
    value = attr(element, name)
    if value is None:
        raise NcclXmlError(f"<{element.tag}> has no {name}= attribute", line=element.line, source=source)
    try:
        return int(value, 0)
    except ValueError as exc:
        raise NcclXmlError(
            f"<{element.tag} {name}={value!r}> is not a number", line=element.line, source=source
        ) from exc


def _pcie_gen(link_speed: str | None) -> int | None:
    if not link_speed:
        return None
    return _GEN_BY_RATE.get(link_speed.split()[0])


@dataclass(frozen=True)
class _Cpu:
    """The `<cpu>` element a device sits under: its NUMA node, CPUs and the root of its PCI paths."""

    numa: int
    cpus: str
    root: str


class _Reader:
    """One pass over a parsed file, filling a `NodeTopology`."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.topo = topology_pb2.NodeTopology(source=f"nccl-xml:{source}")
        self.gpu_links: dict[int, Counter[str]] = {}
        self.gpu_switch: dict[int, int] = {}
        self.nameless_gpus: list[topology_pb2.Gpu] = []
        self.numa_ids: set[int] = set()

    def read(self, root: XmlNode) -> topology_pb2.NodeTopology:
        self.topo.nccl_topology.CopyFrom(root.to_element())
        for cpu in root.children:
            if cpu.tag != "cpu":
                continue
            numa = _int_attr(cpu, "numaid", source=self.source)
            if numa >= 0:
                self.numa_ids.add(numa)
            affinity = attr(cpu, "affinity")
            ctx = _Cpu(numa=numa, cpus=cpulist_from_hex_mask(affinity) if affinity else "", root=f"cpu{numa}")
            for child in cpu.children:
                self.visit(child, ctx, (), None)
        topo = self.topo
        # GPUs written as bare PCI devices (NCCL_TOPO_FILE for VMs) are numbered in file order.
        if self.nameless_gpus and not topo.gpus:
            for index, gpu in enumerate(self.nameless_gpus):
                gpu.index = index
                topo.gpus.append(gpu)
        if self.numa_ids:
            topo.numa_node_count = len(self.numa_ids)
        _links(topo, self.gpu_links, self.gpu_switch)
        _affinities(topo)
        topo.unknowns.extend(_xml_unknowns(topo))
        return topo

    def visit(self, element: XmlNode, ctx: _Cpu, chain: tuple[str, ...], pci: XmlNode | None) -> None:
        if element.tag == "pci":
            busid = attr(element, "busid")
            if busid is None:
                raise NcclXmlError("<pci> has no busid= attribute", line=element.line, source=self.source)
            here = (*chain, busid.lower())
            cls = (attr(element, "class") or "").lower()
            has_gpu = any(c.tag == "gpu" for c in element.children)
            has_nic = any(c.tag == "nic" for c in element.children)
            if cls.startswith(GPU_CLASSES) and not has_gpu:
                self.nameless_gpus.append(self.gpu(element, ctx, here))
            elif (cls.startswith(IB_CLASS) or cls.startswith(ETH_CLASS)) and not has_nic:
                self.nic_from_pci(element, ctx, here, cls)
            for child in element.children:
                self.visit(child, ctx, here, element)
        elif element.tag == "gpu":
            if pci is None:
                raise NcclXmlError("<gpu> outside a <pci> element", line=element.line, source=self.source)
            self.gpu_element(element, ctx, chain, pci)
        elif element.tag == "nic":
            self.nic_element(element, ctx, chain if pci is not None else (), pci)
        else:
            for child in element.children:
                self.visit(child, ctx, chain, pci)

    def gpu(self, pci: XmlNode, ctx: _Cpu, path: tuple[str, ...]) -> topology_pb2.Gpu:
        gpu = topology_pb2.Gpu(pci_bus_id=(attr(pci, "busid") or "").lower(), cpu_affinity=ctx.cpus)
        gpu.pci_path = PciPath(root=ctx.root, chain=path).render()
        if ctx.numa >= 0:
            gpu.numa_node = ctx.numa
        gen = _pcie_gen(attr(pci, "link_speed"))
        if gen is not None:
            gpu.pcie_gen_max = gen
        width = attr(pci, "link_width")
        # NCCL writes link_width="0" when it could not read the width (VMs): unknown, not zero lanes.
        if width and width.isdigit() and int(width) > 0:
            gpu.pcie_width_max = int(width)
        return gpu

    def gpu_element(self, element: XmlNode, ctx: _Cpu, chain: tuple[str, ...], pci: XmlNode) -> None:
        gpu = self.gpu(pci, ctx, chain)
        gpu.index = _int_attr(element, "dev", source=self.source)
        sm = attr(element, "sm")
        if sm:
            gpu.sm_arch = f"sm_{sm}"
        self.topo.gpus.append(gpu)
        counts: Counter[str] = Counter()
        switch = 0
        for link in element.children:
            if link.tag != "nvlink":
                continue
            count = _int_attr(link, "count", source=self.source)
            tclass = (attr(link, "tclass") or "").lower()
            target = (attr(link, "target") or "").lower()
            if tclass.startswith(NVSWITCH_CLASS) or target.startswith("ffffffff"):
                switch += count
            elif target == gpu.pci_bus_id:
                self.topo.unknowns.append(f"GPU{gpu.index} NVLink: {count} links name the GPU itself as peer")
            else:
                counts[target] += count
        self.gpu_links[gpu.index] = counts
        self.gpu_switch[gpu.index] = switch

    def nic_from_pci(self, pci: XmlNode, ctx: _Cpu, path: tuple[str, ...], cls: str) -> None:
        busid = (attr(pci, "busid") or "").lower()
        nic = topology_pb2.Nic(name=f"pci-{busid}", pci_bus_id=busid)
        nic.pci_path = PciPath(root=ctx.root, chain=path).render()
        if cls.startswith(IB_CLASS):
            nic.link_layer = topology_pb2.NIC_LINK_LAYER_INFINIBAND
        if ctx.numa >= 0:
            nic.numa_node = ctx.numa
        self.topo.nics.append(nic)

    def nic_element(self, element: XmlNode, ctx: _Cpu, path: tuple[str, ...], pci: XmlNode | None) -> None:
        """The `<net>`s of one `<nic>`: NCCL puts every port of a PCI device (the functions of a dual-port card
        folded onto function 0) in one `<nic>`, numbering ``port`` as the device's own port plus the count of
        endpoints listed before it there (net_ib's "realPort"); undo that to get the device's port back."""
        nets = sorted(
            (n for n in element.children if n.tag == "net"),
            key=lambda n: _int_or(attr(n, "dev"), default=0),
        )
        nics = [self.nic_from_net(net, ctx, path, pci) for net in nets]
        rdma = [
            (net, nic)
            for net, nic in zip(nets, nics, strict=True)
            if nic.link_layer in (topology_pb2.NIC_LINK_LAYER_INFINIBAND, topology_pb2.NIC_LINK_LAYER_ROCE)
        ]
        per_device = Counter(nic.device for _, nic in rdma)
        numbers = device_ports([_int_or(attr(net, "port"), default=0) for net, _ in rdma])
        for number, (_, nic) in zip(numbers, rdma, strict=True):
            if number > 0:
                nic.port = number
            nic.name = endpoint_name(
                nic.device, nic.port if nic.HasField("port") else None, active_ports=per_device[nic.device]
            )
        self.topo.nics.extend(nics)

    def nic_from_net(self, net: XmlNode, ctx: _Cpu, path: tuple[str, ...], pci: XmlNode | None) -> topology_pb2.Nic:
        nic = topology_pb2.Nic(name=attr(net, "name") or f"net{attr(net, 'dev')}")
        if pci is not None:
            nic.pci_bus_id = (attr(pci, "busid") or "").lower()
            nic.pci_path = PciPath(root=ctx.root, chain=path).render()
            cls = (attr(pci, "class") or "").lower()
            if cls.startswith(IB_CLASS):
                nic.link_layer = topology_pb2.NIC_LINK_LAYER_INFINIBAND
            elif cls.startswith(ETH_CLASS) and (
                attr(net, "guid") not in (None, "0x0", "0") or _int_or(attr(net, "port"), default=0) > 0
            ):
                # An Ethernet controller that NCCL's IB transport drives: it has a GUID, or a port numbered from 1
                # (NCCL's socket transport writes guid 0 and port 0): RoCE.
                nic.link_layer = topology_pb2.NIC_LINK_LAYER_ROCE
        if nic.link_layer == topology_pb2.NIC_LINK_LAYER_UNSPECIFIED and attr(net, "guid") in ("0x0", "0"):
            # NCCL's socket transport reports guid 0: a plain Ethernet interface without RDMA.
            nic.link_layer = topology_pb2.NIC_LINK_LAYER_ETHERNET
        if nic.link_layer in (topology_pb2.NIC_LINK_LAYER_INFINIBAND, topology_pb2.NIC_LINK_LAYER_ROCE):
            nic.device = nic.name
        speed = attr(net, "speed")
        if speed and speed.isdigit() and int(speed) > 0:
            nic.rate_gbps = int(speed) / 1000.0
        gdr = attr(net, "gdr")
        if gdr in ("0", "1"):
            nic.gdr = gdr == "1"
        if ctx.numa >= 0:
            nic.numa_node = ctx.numa
        return nic


def _int_or(text: str | None, *, default: int) -> int:
    try:
        return int(text, 0) if text is not None else default
    except ValueError:
        return default


def read_nccl_topology(text: str, *, source: str = "<nccl-xml>") -> topology_pb2.NodeTopology:
    """Read an NCCL topology XML into a `NodeTopology` (with the element tree kept in ``nccl_topology``)."""
    return _Reader(source).read(parse_xml(text, source=source))


def _numa(message: topology_pb2.Gpu | topology_pb2.Nic) -> int | None:
    return message.numa_node if message.HasField("numa_node") else None


def _links(topo: topology_pb2.NodeTopology, gpu_links: dict[int, Counter[str]], gpu_switch: dict[int, int]) -> None:
    gpus = sorted(topo.gpus, key=lambda g: g.index)
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            link = topology_pb2.GpuLink(
                gpu_a=a.index,
                gpu_b=b.index,
                p2p_read=topology_pb2.P2P_STATUS_UNKNOWN,
                p2p_write=topology_pb2.P2P_STATUS_UNKNOWN,
            )
            direct = max(
                gpu_links.get(a.index, Counter()).get(b.pci_bus_id, 0),
                gpu_links.get(b.index, Counter()).get(a.pci_bus_id, 0),
            )
            if direct:
                link.kind = topology_pb2.LINK_KIND_NVLINK
                link.nvlink_count = direct
            elif gpu_switch.get(a.index) and gpu_switch.get(b.index):
                link.kind = topology_pb2.LINK_KIND_NVLINK
                link.nvlink_count = min(gpu_switch[a.index], gpu_switch[b.index])
                link.via_nvswitch = True
            else:
                link.kind = pcie_level(
                    parse_pci_path(a.pci_path), parse_pci_path(b.pci_path), numa_a=_numa(a), numa_b=_numa(b)
                )
            topo.gpu_links.append(link)


def _affinities(topo: topology_pb2.NodeTopology) -> None:
    for nic in topo.nics:
        for gpu in sorted(topo.gpus, key=lambda g: g.index):
            topo.nic_affinities.append(
                topology_pb2.NicAffinity(
                    nic=nic.name,
                    gpu=gpu.index,
                    kind=pcie_level(
                        parse_pci_path(gpu.pci_path),
                        parse_pci_path(nic.pci_path),
                        numa_a=_numa(gpu),
                        numa_b=_numa(nic),
                    ),
                )
            )


def _xml_unknowns(topo: topology_pb2.NodeTopology) -> list[str]:
    out = ["P2P status: an NCCL topology file does not record it"]
    for gpu in topo.gpus:
        if not gpu.HasField("numa_node"):
            out.append(f"GPU{gpu.index} NUMA node: the file says numaid=-1")
        if not gpu.cpu_affinity:
            out.append(f"GPU{gpu.index} CPU affinity: no affinity= on its <cpu>")
    for nic in topo.nics:
        if not nic.pci_path:
            out.append(f"{nic.name} PCI path: the file puts it directly under <cpu>")
        if nic.link_layer == topology_pb2.NIC_LINK_LAYER_UNSPECIFIED:
            out.append(f"{nic.name} link layer: not in the file")
    return out
