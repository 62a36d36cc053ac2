"""Ready-made clusters: the README demo's, one where NCCL's defaults are already best, and calibration rigs.

* :func:`demo_cluster` — 2 racks x 4 nodes x 8 H100-class GPUs, 8 NDR NICs per node on a rail-optimized
  fabric, and a slow (oversubscribed, ECMP-hashed) spine. Hostnames alternate between the racks, so the
  naive hostname order crosses the spine at every hop: a tuner should find both a rack-grouped order and
  the knobs that soften the spine (more QPs per connection).
* :func:`defaults_optimal_cluster` — one 8-GPU NVSwitch node on bare metal. Nothing there punishes NCCL's
  own choices: no network, so no NIC knobs matter; NVLS is on and wins large all_reduces; NCCL's channel
  and thread choices sit at the model's optimum. A correct tuner must answer "keep NCCL's defaults".
* :func:`h200_vm_pair` and :func:`ndr_pair` — the rigs the calibration test compares against published
  and measured figures.

Non-goal: describing any real site. These are shapes for demos and tests.
"""

from __future__ import annotations

from topo_tune.sim.cluster import Cluster, IntraNodeFabric, Nic, Node, SpineTier, Transport
from topo_tune.sim.profiles import H100_NVSWITCH, H100_SXM, H200_SXM_VM, H200_VM_NVSWITCH

_NDR_GBPS = 400.0


def ndr_nics(count: int = 8, *, transport: Transport = Transport.IB) -> tuple[Nic, ...]:
    """``count`` NDR 400G NICs on rails 0..count-1."""
    return tuple(Nic(name=f"mlx5_{i}", line_rate_gbps=_NDR_GBPS, rail=i, transport=transport) for i in range(count))


def h100_node(name: str, rack: str, *, nics: int = 8, fabric: IntraNodeFabric = H100_NVSWITCH) -> Node:
    """An 8x H100 SXM node (NVSwitch, NVLS) with ``nics`` NDR NICs."""
    return Node(name=name, rack=rack, gpus=8, fabric=fabric, nics=ndr_nics(nics), profile=H100_SXM)


def demo_cluster(*, oversubscription: float = 3.0, ecmp_paths: int = 4) -> Cluster:
    """The README demo: 2 racks x 4 nodes x 8 H100, slow spine, hostnames interleaved across racks."""
    nodes = tuple(h100_node(f"gpu-{i + 1:02d}", "rack-a" if i % 2 == 0 else "rack-b") for i in range(8))
    return Cluster(
        nodes=nodes,
        spine=SpineTier(oversubscription=oversubscription, ecmp_paths=ecmp_paths, latency_us=1.5),
        rail_optimized=True,
        name="demo: 2 racks x 4 nodes x 8 H100, slow spine",
    )


def defaults_optimal_cluster() -> Cluster:
    """One bare-metal 8x H100 NVSwitch node: NCCL's defaults are the model's optimum here."""
    return Cluster(nodes=(h100_node("solo-01", "rack-a"),), name="defaults optimal: one 8x H100 node")


def h200_vm_pair() -> Cluster:
    """One VM with 2 H200 GPUs on NVLink, as measured for calibration (no NVLS in the VM)."""
    node = Node(
        name="h200-vm",
        rack="rack-a",
        gpus=2,
        fabric=H200_VM_NVSWITCH,
        nics=(),
        profile=H200_SXM_VM,
    )
    return Cluster(nodes=(node,), name="2x H200 VM")


def ndr_pair(*, gpus: int = 8, nics: int = 8) -> Cluster:
    """Two H100 nodes on one non-blocking switch: the per-NIC network calibration rig."""
    nodes = tuple(
        Node(
            name=f"ndr-{i}",
            rack="rack-a",
            gpus=gpus,
            fabric=H100_NVSWITCH,
            nics=ndr_nics(nics),
            profile=H100_SXM,
        )
        for i in range(2)
    )
    return Cluster(nodes=nodes, name=f"2 nodes x {gpus} H100, {nics} NDR NICs each")


def scale_cluster(*, racks: int, nodes_per_rack: int, oversubscription: float = 2.0) -> Cluster:
    """A large synthetic H100 cluster (for throughput benchmarks and scale tests)."""
    nodes = tuple(h100_node(f"r{r:03d}n{i:03d}", f"rack-{r:03d}") for r in range(racks) for i in range(nodes_per_rack))
    return Cluster(
        nodes=nodes,
        spine=SpineTier(oversubscription=oversubscription, ecmp_paths=8),
        name=f"{racks} racks x {nodes_per_rack} nodes x 8 H100",
    )
