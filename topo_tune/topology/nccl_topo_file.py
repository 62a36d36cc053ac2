"""Write an ``NCCL_TOPO_FILE``: a node's PCI tree as NCCL reads it, and the file a VM needs.

Purpose: the host's tree (its captured NCCL dump, else one built from discovered PCI paths, with each RDMA
endpoint placed as NCCL folds it); and for a VM, that tree with only `<cpu>` and `<pci>` elements, the VM's
bus ids on the devices and bus ids that do not exist in the VM on the bridges (NVIDIA/nccl#1843,
nccl-tests#86).

Non-goals: reading a dump (``nccl_dump``); finding the VM's bus ids (the caller maps them).
"""

from __future__ import annotations

from collections.abc import Mapping

from topo_tune.topology.cpulist import hex_mask_from_cpulist
from topo_tune.topology.nccl_xml import BRIDGE_CLASS, Element, attr, render_xml
from topo_tune.topology.nic_ports import Endpoint, folded_bus_id, nccl_ports
from topo_tune.topology.pci import PciPath, parse_pci_path
from topo_tune.v1 import topology_pb2


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
                    found.attributes.add(name="class", value=cls if last else BRIDGE_CLASS)
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
