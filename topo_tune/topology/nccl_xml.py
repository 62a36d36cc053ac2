"""NCCL topology XML: read what ``NCCL_TOPO_DUMP_FILE`` writes, write an ``NCCL_TOPO_FILE`` for VMs.

Purpose: turn NCCL's own view of a node (`<system>` / `<cpu>` / `<pci>` / `<gpu>` / `<nvlink>` / `<nic>` /
`<net>`) into the same `NodeTopology` discovery produces, keeping the element tree itself for a lossless
write-back; and build the file NCCL needs inside a VM: the host's PCI tree (CPU and PCI elements only) with the
VM's bus ids on the devices and bus ids that do not exist in the VM on the bridges (NVIDIA/nccl#1843,
nccl-tests#86). Malformed files raise `NcclXmlError` naming the line. Non-goals: graph files
(``NCCL_GRAPH_FILE``), which only matter in an expert mode.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from xml.parsers import expat

from topo_tune.errors import TopoTuneError
from topo_tune.topology.cpulist import cpulist_from_hex_mask, hex_mask_from_cpulist
from topo_tune.topology.nic_ports import Endpoint, device_ports, endpoint_name, folded_bus_id, nccl_ports
from topo_tune.topology.pci import NCCL_PATH_PREFIX, PciPath, parse_pci_path, pcie_level
from topo_tune.v1 import topology_pb2

Element = topology_pb2.NcclXmlElement

_GPU_CLASSES = ("0x0300", "0x0302")
_IB_CLASS = "0x0207"
_ETH_CLASS = "0x0200"
_BRIDGE_CLASS = "0x060400"
_NVSWITCH_CLASS = "0x0680"
# PCIe transfer rate per lane to generation.
_GEN_BY_RATE = {"2.5": 1, "5.0": 2, "5": 2, "8.0": 3, "8": 3, "16.0": 4, "16": 4, "32.0": 5, "32": 5, "64.0": 6}


class NcclXmlError(TopoTuneError, ValueError):
    """An NCCL topology file that cannot be read; the message names the line."""

    def __init__(self, message: str, *, line: int | None, source: str) -> None:
        where = f"{source}, line {line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.line = line
        self.source = source


@dataclass
class XmlAttribute:
    name: str
    value: str


@dataclass
class XmlNode:
    """A parsed element that remembers its line, so later checks can name it."""

    tag: str
    attributes: list[XmlAttribute] = field(default_factory=list)
    children: list[XmlNode] = field(default_factory=list)
    line: int | None = None

    def to_element(self) -> Element:
        element = Element(tag=self.tag)
        for a in self.attributes:
            element.attributes.add(name=a.name, value=a.value)
        element.children.extend(child.to_element() for child in self.children)
        return element


def attr(element: Element | XmlNode, name: str) -> str | None:
    for a in element.attributes:
        if a.name == name:
            return a.value
    return None


def parse_xml(text: str, *, source: str = "<nccl-xml>") -> XmlNode:
    """Parse XML text into `XmlNode`s; a syntax error raises `NcclXmlError` with expat's line."""
    parser = expat.ParserCreate()
    parser.ordered_attributes = True
    stack: list[XmlNode] = []
    roots: list[XmlNode] = []

    def start(tag: str, attrs: list[str]) -> None:
        node = XmlNode(
            tag=tag,
            attributes=[XmlAttribute(attrs[i], attrs[i + 1]) for i in range(0, len(attrs), 2)],
            line=parser.CurrentLineNumber,
        )
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)

    def end(tag: str) -> None:
        stack.pop()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise NcclXmlError(expat.errors.messages[exc.code], line=exc.lineno, source=source) from exc
    if not roots or roots[0].tag != "system":
        raise NcclXmlError("the root element must be <system>", line=1, source=source)
    return roots[0]


def render_xml(root: Element) -> str:
    """Write elements the way NCCL does: two-space indent, attributes in order, ``/>`` for empty elements."""
    lines: list[str] = []

    def emit(element: Element, depth: int) -> None:
        attrs = "".join(f' {a.name}="{_escape(a.value)}"' for a in element.attributes)
        pad = "  " * depth
        if element.children:
            lines.append(f"{pad}<{element.tag}{attrs}>")
            for child in element.children:
                emit(child, depth + 1)
            lines.append(f"{pad}</{element.tag}>")
        else:
            lines.append(f"{pad}<{element.tag}{attrs}/>")

    emit(root, 0)
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


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
            if cls.startswith(_GPU_CLASSES) and not has_gpu:
                self.nameless_gpus.append(self.gpu(element, ctx, here))
            elif (cls.startswith(_IB_CLASS) or cls.startswith(_ETH_CLASS)) and not has_nic:
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
            if tclass.startswith(_NVSWITCH_CLASS) or target.startswith("ffffffff"):
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
        if cls.startswith(_IB_CLASS):
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
            if cls.startswith(_IB_CLASS):
                nic.link_layer = topology_pb2.NIC_LINK_LAYER_INFINIBAND
            elif cls.startswith(_ETH_CLASS) and (
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


# --- NCCL_TOPO_FILE for a VM -----------------------------------------------------------------------------


def host_pci_tree(host: topology_pb2.NodeTopology) -> Element:
    """The host's tree: its captured NCCL dump when there is one, else one built from discovered PCI paths.

    A built tree places each RDMA endpoint as NCCL does: a `<nic>` under the PCI device NCCL folds the card's
    functions onto, with one `<net name= dev= speed= port= gdr=>` per active port (`topo_tune.topology.nic_ports`).
    """
    if host.nccl_topology.tag:
        return host.nccl_topology
    system = Element(tag="system")
    system.attributes.add(name="version", value="1")
    by_numa: dict[int, list[tuple[PciPath, str, str]]] = {}
    affinity: dict[int, str] = {}
    for gpu in host.gpus:
        path = parse_pci_path(gpu.pci_path)
        if path is not None and path.root.startswith("pci"):
            numa = gpu.numa_node if gpu.HasField("numa_node") else -1
            by_numa.setdefault(numa, []).append((path, "0x030200", _speed(gpu)))
            if gpu.cpu_affinity:
                affinity.setdefault(numa, gpu.cpu_affinity)
    nets: dict[str, list[tuple[int, topology_pb2.Nic, int]]] = {}
    numbering = nccl_ports(
        [Endpoint(name=n.name, bus_id=n.pci_bus_id, port=n.port) for n in host.nics if n.device and n.HasField("port")]
    )
    for nic in host.nics:
        path = parse_pci_path(nic.pci_path)
        if path is not None and path.root.startswith("pci"):
            numa = nic.numa_node if nic.HasField("numa_node") else -1
            cls = "0x020700" if nic.link_layer == topology_pb2.NIC_LINK_LAYER_INFINIBAND else "0x020000"
            if nic.name in numbering:
                path = PciPath(root=path.root, chain=(*path.chain[:-1], folded_bus_id(path.device)))
                place = numbering[nic.name]
                nets.setdefault(path.device, []).append((place.dev, nic, place.port))
            by_numa.setdefault(numa, []).append((path, cls, ""))
    for numa in sorted(by_numa):
        cpu = system.children.add(tag="cpu")
        cpu.attributes.add(name="numaid", value=str(numa))
        if numa in affinity:
            cpu.attributes.add(name="affinity", value=hex_mask_from_cpulist(affinity[numa]))
        for path, cls, speed in sorted(by_numa[numa], key=lambda item: item[0].chain):
            parent = cpu
            for depth, busid in enumerate(path.chain):
                found = next((c for c in parent.children if attr(c, "busid") == busid), None)
                if found is None:
                    found = parent.children.add(tag="pci")
                    found.attributes.add(name="busid", value=busid)
                    last = depth == len(path.chain) - 1
                    found.attributes.add(name="class", value=cls if last else _BRIDGE_CLASS)
                    if speed:
                        found.attributes.add(name="link_speed", value=speed)
                    if last and busid in nets:
                        _add_nets(found.children.add(tag="nic"), sorted(nets[busid], key=lambda item: item[0]))
                parent = found
    return system


def _add_nets(nic_element: Element, nets: list[tuple[int, topology_pb2.Nic, int]]) -> None:
    for dev, nic, port in nets:
        net = nic_element.children.add(tag="net")
        net.attributes.add(name="name", value=nic.device)
        net.attributes.add(name="dev", value=str(dev))
        if nic.HasField("rate_gbps"):
            # NCCL's speed is in Mb/s.
            net.attributes.add(name="speed", value=str(round(nic.rate_gbps * 1000)))
        net.attributes.add(name="port", value=str(port))
        if nic.HasField("gdr"):
            net.attributes.add(name="gdr", value="1" if nic.gdr else "0")


def nccl_topology_xml(topo: topology_pb2.NodeTopology) -> str:
    """The node as an NCCL topology file: its captured dump, else the tree `host_pci_tree` builds."""
    return render_xml(host_pci_tree(topo))


def _speed(gpu: topology_pb2.Gpu) -> str:
    rates = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0", 6: "64.0"}
    return f"{rates[gpu.pcie_gen_max]} GT/s PCIe" if gpu.HasField("pcie_gen_max") else ""


def vm_topology_file(host: topology_pb2.NodeTopology, *, bus_ids: Mapping[str, str]) -> str:
    """An ``NCCL_TOPO_FILE`` for a VM whose devices are the host's, seen under other bus ids.

    ``bus_ids`` maps each host device bus id (GPU or NIC) to the bus id the VM shows. The result keeps only
    `<cpu>` and `<pci>` elements: bridges get bus ids of the form ``ffff:ff:NN.0`` that no VM device has, devices
    the VM's ids, and subtrees without a mapped device are dropped. Raises ValueError naming an unmapped id.
    """
    tree = host_pci_tree(host)
    wanted = {k.lower(): v.lower() for k, v in bus_ids.items()}
    used: set[str] = set()
    counter = iter(range(1, 256))
    out = Element(tag="system", attributes=[a for a in tree.attributes if a.name == "version"])
    if not out.attributes:
        out.attributes.add(name="version", value="1")

    def copy_pci(element: Element) -> Element | None:
        busid = (attr(element, "busid") or "").lower()
        children = [c for c in (copy_pci(child) for child in element.children if child.tag == "pci") if c]
        if busid in wanted:
            used.add(busid)
            new = Element(tag="pci")
            for a in element.attributes:
                new.attributes.add(name=a.name, value=wanted[busid] if a.name == "busid" else a.value)
            new.children.extend(children)
            return new
        if not children:
            return None
        new = Element(tag="pci")
        for a in element.attributes:
            value = f"ffff:ff:{next(counter):02x}.0" if a.name == "busid" else a.value
            new.attributes.add(name=a.name, value=value)
        new.children.extend(children)
        return new

    for cpu in tree.children:
        if cpu.tag != "cpu":
            continue
        new_cpu = Element(tag="cpu", attributes=[a for a in cpu.attributes if a.name != "host_hash"])
        for child in cpu.children:
            if child.tag == "pci":
                copied = copy_pci(child)
                if copied is not None:
                    new_cpu.children.append(copied)
        if new_cpu.children:
            out.children.append(new_cpu)
    missing = sorted(set(wanted) - used)
    if missing:
        raise ValueError(f"bus_ids: host device(s) {', '.join(missing)} are not in the host's PCI tree")
    return render_xml(out)


__all__ = [
    "NCCL_PATH_PREFIX",
    "NcclXmlError",
    "XmlNode",
    "host_pci_tree",
    "nccl_topology_xml",
    "parse_xml",
    "read_nccl_topology",
    "render_xml",
    "vm_topology_file",
]
