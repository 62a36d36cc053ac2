"""Node discovery: NVML + sysfs into a `NodeTopology`.

Purpose: the one function the agent calls to describe its node: GPUs, the GPU↔GPU matrix (NVLink counted per
remote bus id, NVSwitch recognised, otherwise the PCIe level), NICs with their GPU affinity, NUMA/CPU affinity and
versions. Whatever NVML or sysfs cannot tell is left unset and named in ``unknowns``; nothing is guessed, and
`discover` never raises. Non-goals: benchmarks, NCCL's own topology dump (see `topo_tune.topology.nccl_dump`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import math
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from topo_tune.agent.discovery.nvml import (
    NVLINK_DEVICE_GPU,
    NVLINK_DEVICE_SWITCH,
    NVML_ERROR_INVALID_ARGUMENT,
    P2P_CAPS_INDEX_READ,
    P2P_CAPS_INDEX_WRITE,
    P2P_STATUS_OK,
    P2P_STATUS_UNKNOWN,
    NvmlApi,
    PynvmlBackend,
)
from topo_tune.agent.discovery.sysfs import Sysfs, SysfsNic
from topo_tune.errors import CpuListError, NvmlCallError
from topo_tune.nccl.library import library_version
from topo_tune.topology.cpulist import cpulist_from_mask_words, parse_cpulist
from topo_tune.topology.levels import kind_from_nvml_level
from topo_tune.topology.nic_ports import endpoint_name
from topo_tune.topology.pci import normalize_bus_id, parse_pci_path, pcie_level
from topo_tune.v1 import topology_pb2

logger = logging.getLogger(__name__)

# NVML_NVLINK_MAX_LINKS in current headers; H100/H200 use 18, NVML answers INVALID_ARGUMENT past the last.
NVLINK_MAX_LINKS = 36
SOURCE = "nvml+sysfs"


@dataclass
class _GpuLinks:
    """What NVML said about one GPU's NVLinks; ``known`` is False when it answered no link state."""

    known: bool = False
    to_gpu: Counter[str] = field(default_factory=Counter)
    to_switch: int = 0
    # Active links whose remote type NVML would not give: resolved once all GPU bus ids are known.
    to_unknown: Counter[str] = field(default_factory=Counter)


def discover(
    *,
    nvml: NvmlApi | None = None,
    sysfs_root: Path = Path("/"),
    hostname: str | None = None,
    nccl_version: Callable[[], str | None] | None = None,
) -> topology_pb2.NodeTopology:
    """Describe this node. Never raises: failures become entries in ``unknowns``.

    ``nvml`` defaults to the real NVML through pynvml, ``sysfs_root`` to ``/``; tests pass recordings.
    ``nccl_version`` defaults to asking ``libnccl.so.2`` for its version.
    """
    topo = topology_pb2.NodeTopology(source=SOURCE)
    sysfs = Sysfs(sysfs_root)
    try:
        _discover_host(topo, sysfs, hostname)
        api = nvml if nvml is not None else _real_nvml(topo)
        if api is not None:
            _discover_gpus(topo, api, sysfs)
        _discover_nics(topo, sysfs)
        _nic_affinities(topo)
        probe = nccl_version if nccl_version is not None else libnccl_version
        try:
            topo.versions.nccl = probe() or ""
        except Exception as exc:  # a broken library must not stop discovery
            logger.info("NCCL version probe failed: %s", exc)
        if not topo.versions.nccl:
            topo.unknowns.append("NCCL version: no libnccl found to ask")
    except Exception as exc:
        # Discovery runs inside the agent: report what is known rather than crash it.
        logger.exception("discovery failed part-way")
        topo.unknowns.append(f"discovery stopped early: {type(exc).__name__}: {exc}")
    return topo


def _real_nvml(topo: topology_pb2.NodeTopology) -> NvmlApi | None:
    try:
        return PynvmlBackend()
    except ImportError as exc:
        topo.unknowns.append(f"GPUs: the pynvml module is missing ({exc})")
        return None


def _discover_host(topo: topology_pb2.NodeTopology, sysfs: Sysfs, hostname: str | None) -> None:
    topo.hostname = hostname if hostname is not None else socket.gethostname()
    online = sysfs.read("sys/devices/system/cpu/online")
    try:
        topo.cpu_count = len(parse_cpulist(online)) if online else 0
    except CpuListError:
        topo.cpu_count = 0
    if topo.cpu_count == 0:
        topo.unknowns.append("CPU count: sys/devices/system/cpu/online unreadable")
    memory = sysfs.meminfo_total_bytes()
    if memory is None:
        topo.unknowns.append("host memory: /proc/meminfo unreadable")
    else:
        topo.memory_bytes = memory
    nodes = sysfs.read("sys/devices/system/node/online")
    try:
        if nodes:
            topo.numa_node_count = len(parse_cpulist(nodes))
    except CpuListError:
        pass
    if not topo.HasField("numa_node_count"):
        topo.unknowns.append("NUMA node count: sys/devices/system/node/online unreadable")
    cpuinfo = sysfs.cpuinfo()
    if cpuinfo is None:
        topo.unknowns.append("CPU model and virtualisation: /proc/cpuinfo unreadable")
    else:
        flags: list[str] = []
        for line in cpuinfo.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not topo.cpu_model:
                topo.cpu_model = value.strip()
            elif key == "flags" and not flags:
                flags = value.split()
        if flags:
            # The CPUID hypervisor bit: set by every mainstream hypervisor (KVM, Firecracker, Hyper-V, Xen HVM).
            topo.virtualized = "hypervisor" in flags
        else:
            topo.unknowns.append("virtualisation: no CPU flags in /proc/cpuinfo")
    topo.versions.kernel = sysfs.read("proc/sys/kernel/osrelease") or ""
    try:
        topo.versions.topo_tune = importlib.metadata.version("topo-tune")
    except importlib.metadata.PackageNotFoundError:
        topo.versions.topo_tune = ""
    try:
        topo.versions.torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        topo.versions.torch = ""


def _try(fn: Callable[[], object], unknowns: list[str], what: str) -> object | None:
    try:
        return fn()
    except NvmlCallError as exc:
        unknowns.append(f"{what}: NVML says {exc.message}")
        return None


def _discover_gpus(topo: topology_pb2.NodeTopology, nvml: NvmlApi, sysfs: Sysfs) -> None:
    unknowns: list[str] = []
    try:
        nvml.init()
    except NvmlCallError as exc:
        topo.unknowns.append(f"GPUs: NVML could not start ({exc.message})")
        return
    try:
        try:
            topo.versions.driver = nvml.driver_version()
        except NvmlCallError as exc:
            unknowns.append(f"driver version: NVML says {exc.message}")
        try:
            cuda = nvml.cuda_driver_version()
            topo.versions.cuda = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        except NvmlCallError as exc:
            unknowns.append(f"CUDA version: NVML says {exc.message}")
        try:
            count = nvml.device_count()
        except NvmlCallError as exc:
            topo.unknowns.append(f"GPUs: NVML could not count them ({exc.message})")
            return
        for index in range(count):
            topo.gpus.append(_discover_gpu(index, nvml, sysfs, _affinity_words(sysfs, topo.cpu_count), unknowns))
        links = [_nvlinks(gpu, nvml, unknowns) for gpu in topo.gpus]
        _gpu_pairs(topo, nvml, links, unknowns)
    finally:
        topo.unknowns.extend(unknowns)
        try:
            nvml.shutdown()
        except NvmlCallError as exc:
            logger.info("nvmlShutdown failed: %s", exc)


def _affinity_words(sysfs: Sysfs, cpu_count: int) -> int:
    """64-bit words NVML needs for the CPU mask: enough for the highest CPU id, which can exceed the count of
    online CPUs when some are offline."""
    online = sysfs.read("sys/devices/system/cpu/online") or ""
    try:
        highest = max(parse_cpulist(online), default=cpu_count - 1)
    except CpuListError:
        highest = cpu_count - 1
    return max(1, math.ceil((highest + 1) / 64))


def _discover_gpu(index: int, nvml: NvmlApi, sysfs: Sysfs, words: int, unknowns: list[str]) -> topology_pb2.Gpu:
    gpu = topology_pb2.Gpu(index=index)
    tag = f"GPU{index}"
    uuid = _try(lambda: nvml.uuid(index), unknowns, f"{tag} UUID")
    gpu.uuid = str(uuid) if uuid is not None else ""
    name = _try(lambda: nvml.name(index), unknowns, f"{tag} name")
    gpu.name = str(name) if name is not None else ""
    bus = _try(lambda: nvml.pci_bus_id(index), unknowns, f"{tag} PCI bus id")
    gpu.pci_bus_id = normalize_bus_id(str(bus)) if bus is not None else ""
    cc = _try(lambda: nvml.compute_capability(index), unknowns, f"{tag} compute capability")
    if isinstance(cc, tuple | list) and len(cc) == 2:
        gpu.sm_arch = f"sm_{int(cc[0])}{int(cc[1])}"
    readers: tuple[tuple[str, Callable[[int], int]], ...] = (
        ("memory_bytes", nvml.memory_total),
        ("pcie_gen_current", nvml.pcie_gen_current),
        ("pcie_gen_max", nvml.pcie_gen_max),
        ("pcie_width_current", nvml.pcie_width_current),
        ("pcie_width_max", nvml.pcie_width_max),
    )
    for attr, read in readers:
        try:
            setattr(gpu, attr, int(read(index)))
        except NvmlCallError as exc:
            unknowns.append(f"{tag} {attr.replace('_', ' ')}: NVML says {exc.message}")
    if gpu.pci_bus_id:
        gpu.pci_path = sysfs.pci_path(gpu.pci_bus_id) or ""
    if not gpu.pci_path:
        unknowns.append(f"{tag} PCI path: not in sys/bus/pci/devices")
    # The NUMA node the GPU hangs off (nvidia-smi's "NUMA Affinity") is the PCI device's node in sysfs. NVML's
    # NumaNodeId is the GPU *memory's* node on coherent systems (Grace Hopper), so it only fills a gap.
    from_sysfs = sysfs.pci_numa_node(gpu.pci_bus_id) if gpu.pci_bus_id else None
    try:
        from_nvml: int | None = nvml.numa_node(index)
        nvml_says = ""
    except NvmlCallError as exc:
        from_nvml, nvml_says = None, exc.message
    if from_sysfs is not None:
        gpu.numa_node = from_sysfs
    elif from_nvml is not None and from_nvml >= 0:
        gpu.numa_node = from_nvml
    else:
        unknowns.append(f"{tag} NUMA node: NVML says {nvml_says or from_nvml}, sysfs has none")
    try:
        gpu.cpu_affinity = cpulist_from_mask_words(nvml.cpu_affinity(index, words))
    except NvmlCallError as exc:
        gpu.cpu_affinity = (sysfs.pci_local_cpulist(gpu.pci_bus_id) if gpu.pci_bus_id else None) or ""
        if not gpu.cpu_affinity:
            unknowns.append(f"{tag} CPU affinity: NVML says {exc.message}, sysfs has none")
    return gpu


def _nvlinks(gpu: topology_pb2.Gpu, nvml: NvmlApi, unknowns: list[str]) -> _GpuLinks:
    result = _GpuLinks()
    for link in range(NVLINK_MAX_LINKS):
        try:
            state = nvml.nvlink_state(gpu.index, link)
        except NvmlCallError as exc:
            if link > 0 and exc.code == NVML_ERROR_INVALID_ARGUMENT:
                break  # past this GPU's last link
            if link == 0:
                unknowns.append(f"GPU{gpu.index} NVLink: NVML says {exc.message}")
                return result
            continue
        result.known = True
        if state != 1:
            continue
        try:
            if nvml.nvlink_p2p_supported(gpu.index, link) == 0:
                continue
        except NvmlCallError:
            pass  # NCCL too counts an active link whose capability it cannot read
        try:
            remote = normalize_bus_id(nvml.nvlink_remote_bus_id(gpu.index, link))
        except NvmlCallError as exc:
            unknowns.append(f"GPU{gpu.index} NVLink {link} peer: NVML says {exc.message}")
            continue
        try:
            kind = nvml.nvlink_remote_device_type(gpu.index, link)
        except NvmlCallError:
            result.to_unknown[remote] += 1
            continue
        if kind == NVLINK_DEVICE_SWITCH:
            result.to_switch += 1
        elif kind == NVLINK_DEVICE_GPU:
            result.to_gpu[remote] += 1
    if not result.known:
        unknowns.append(f"GPU{gpu.index} NVLink: NVML answered no link state")
    return result


def _p2p(nvml: NvmlApi, a: int, b: int, *, caps: int) -> topology_pb2.P2PStatus.ValueType:
    try:
        status = nvml.p2p_status(a, b, caps)  # positional: recorded and replayed as NVML is called
    except NvmlCallError:
        return topology_pb2.P2P_STATUS_UNKNOWN
    if status == P2P_STATUS_OK:
        return topology_pb2.P2P_STATUS_OK
    if status == P2P_STATUS_UNKNOWN:
        return topology_pb2.P2P_STATUS_UNKNOWN
    return topology_pb2.P2P_STATUS_NOT_SUPPORTED


def _gpu_pairs(topo: topology_pb2.NodeTopology, nvml: NvmlApi, links: list[_GpuLinks], unknowns: list[str]) -> None:
    gpus = list(topo.gpus)
    unsure_pairs: list[str] = []
    # Like NCCL: a link whose peer is none of our GPUs lands on an NVSwitch.
    buses = {g.pci_bus_id for g in gpus}
    for result in links:
        for remote, count in result.to_unknown.items():
            if remote in buses:
                result.to_gpu[remote] += count
            else:
                result.to_switch += count
    for i, a in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            b = gpus[j]
            link = topology_pb2.GpuLink(gpu_a=a.index, gpu_b=b.index)
            la, lb = links[i], links[j]
            direct = max(la.to_gpu.get(b.pci_bus_id, 0), lb.to_gpu.get(a.pci_bus_id, 0))
            if direct:
                link.kind = topology_pb2.LINK_KIND_NVLINK
                link.nvlink_count = direct
            elif la.to_switch and lb.to_switch:
                link.kind = topology_pb2.LINK_KIND_NVLINK
                link.nvlink_count = min(la.to_switch, lb.to_switch)
                link.via_nvswitch = True
            else:
                try:
                    link.kind = kind_from_nvml_level(nvml.common_ancestor(a.index, b.index))
                except NvmlCallError as exc:
                    link.kind = pcie_level(
                        parse_pci_path(a.pci_path),
                        parse_pci_path(b.pci_path),
                        numa_a=a.numa_node if a.HasField("numa_node") else None,
                        numa_b=b.numa_node if b.HasField("numa_node") else None,
                    )
                    unknowns.append(
                        f"GPU{a.index}-GPU{b.index} PCIe level: NVML says {exc.message}; taken from sysfs paths"
                    )
                if not (la.known and lb.known):
                    unsure_pairs.append(f"GPU{a.index}-GPU{b.index}")
            link.p2p_read = _p2p(nvml, a.index, b.index, caps=P2P_CAPS_INDEX_READ)
            link.p2p_write = _p2p(nvml, a.index, b.index, caps=P2P_CAPS_INDEX_WRITE)
            topo.gpu_links.append(link)
    if unsure_pairs:
        unknowns.append("NVLink between " + ", ".join(unsure_pairs) + ": unknown; the matrix shows their PCIe level")


def _to_nic(nic: SysfsNic, gdr_loaded: bool, *, name: str) -> topology_pb2.Nic:
    out = topology_pb2.Nic(
        name=name,
        port_state=nic.port_state,
        gid_types=list(nic.gid_types),
        pci_path=nic.pci_path,
        pci_bus_id=nic.pci_bus_id,
        netdevs=list(nic.netdevs),
    )
    if not nic.rdma:
        out.link_layer = topology_pb2.NIC_LINK_LAYER_ETHERNET
        out.gdr = False  # GPUDirect RDMA needs an RDMA device
    else:
        out.device = nic.name
        if nic.port is not None:
            out.port = nic.port
        layer = nic.link_layer.lower()
        if layer == "infiniband":
            out.link_layer = topology_pb2.NIC_LINK_LAYER_INFINIBAND
        elif layer == "ethernet":
            out.link_layer = topology_pb2.NIC_LINK_LAYER_ROCE
        if gdr_loaded:
            out.gdr = True
    if nic.rate_gbps is not None:
        out.rate_gbps = nic.rate_gbps
    if nic.numa_node is not None:
        out.numa_node = nic.numa_node
    return out


def _active_rdma_ports(topo: topology_pb2.NodeTopology, ports: list[SysfsNic]) -> list[SysfsNic]:
    """The ports NCCL would open: it skips every port whose state is not ACTIVE (ibv_query_port); those are
    recorded in ``excluded_nics`` with their state. A port whose state cannot be read is kept (unknown)."""
    kept = []
    for port in ports:
        state = port.port_state.upper()
        if state and state != "ACTIVE":
            label = f"{port.name}:{port.port}" if port.port is not None else port.name
            physical = f", physical state {port.phys_state}" if port.phys_state else ""
            topo.excluded_nics.append(
                topology_pb2.ExcludedNic(
                    name=label, reason=f"port {port.port} is {port.port_state}{physical}; NCCL uses ACTIVE ports only"
                )
            )
            continue
        kept.append(port)
    return kept


def _discover_nics(topo: topology_pb2.NodeTopology, sysfs: Sysfs) -> None:
    ports = sysfs.rdma_ports()
    rdma = _active_rdma_ports(topo, ports)
    active = Counter(port.name for port in rdma)
    gdr_loaded = sysfs.gdr_driver_loaded()
    # Netdevs of every RDMA device, down ports' included: they are the device's, not plain Ethernet NICs.
    covered = {dev for nic in ports for dev in nic.netdevs}
    for nic in [*rdma, *sysfs.ethernet_nics(exclude=covered)]:
        name = endpoint_name(nic.name, nic.port, active_ports=active[nic.name]) if nic.rdma else nic.name
        out = _to_nic(nic, gdr_loaded, name=name)
        if nic.rdma and not gdr_loaded:
            topo.unknowns.append(f"{name} GPUDirect RDMA: nvidia_peermem not loaded, dma-buf not checked")
        if nic.rdma and not nic.port_state:
            topo.unknowns.append(f"{name} port state: ports/*/state unreadable")
        if out.link_layer == topology_pb2.NIC_LINK_LAYER_UNSPECIFIED:
            topo.unknowns.append(f"{name} link layer: ports/*/link_layer unreadable")
        if not out.HasField("rate_gbps"):
            topo.unknowns.append(f"{name} rate: not reported")
        if not out.pci_path:
            topo.unknowns.append(f"{name} PCI path: not a PCI device in sysfs")
        elif not out.HasField("numa_node"):
            topo.unknowns.append(f"{name} NUMA node: sysfs says -1")
        topo.nics.append(out)


def _nic_affinities(topo: topology_pb2.NodeTopology) -> None:
    for nic in topo.nics:
        nic_path = parse_pci_path(nic.pci_path)
        for gpu in topo.gpus:
            topo.nic_affinities.append(
                topology_pb2.NicAffinity(
                    nic=nic.name,
                    gpu=gpu.index,
                    kind=pcie_level(
                        parse_pci_path(gpu.pci_path),
                        nic_path,
                        numa_a=gpu.numa_node if gpu.HasField("numa_node") else None,
                        numa_b=nic.numa_node if nic.HasField("numa_node") else None,
                    ),
                )
            )


def libnccl_version() -> str | None:
    """Ask libnccl itself (ncclGetVersion): the nvidia-nccl wheel's first, then the system's; None if absent.

    The wheel's library is the one torch (and so every benchmark worker) loads; a system libnccl2 package
    beside it can be older, and results are keyed by the version that actually ran (seen on an H200 VM:
    system 2.28.3, wheel 2.28.9)."""
    candidates: list[str] = []
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(str(Path(location) / "lib" / "libnccl.so.2"))
    candidates.append("libnccl.so.2")
    for candidate in candidates:
        version = library_version(candidate)
        if version is not None:
            return version
    return None
