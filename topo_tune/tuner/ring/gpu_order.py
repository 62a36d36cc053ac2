"""The GPU order inside one node, and (expert mode only) the NCCL graph file that pins it.

Purpose: when a node's GPU links are not uniform (NVLink pairs over PCIe, PCIe switches across sockets), the ring
order of its GPUs matters; compute it with the ring optimizer on the modelled (or measured) GPU-pair matrix.
NCCL already searches intra-node rings itself and NVIDIA calls graph injection "good for experiments", so the
``NCCL_GRAPH_FILE`` rendering refuses to run unless the caller asks for the expert mode explicitly
(NCCL_FACTS §2.3). Non-goals: trees, NVLS, per-channel NIC balancing beyond the nearest NIC.
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.errors import ExpertModeRequired
from topo_tune.topology.distance import PairMatrix, gpu_pair_matrix
from topo_tune.topology.levels import closeness, nccl_path_type
from topo_tune.tuner.ring.optimizer import optimize_ring
from topo_tune.v1 import topology_pb2


@dataclass(frozen=True)
class GpuRing:
    order: tuple[int, ...]  # GPU indices
    bottleneck_gbps: float
    uniform: bool  # every pair alike: NCCL's own search does as well, no file is needed


def intra_node_ring(topo: topology_pb2.NodeTopology, pairs: PairMatrix | None = None) -> GpuRing:
    """The best ring over this node's GPUs (by index). ``pairs`` may carry measured values."""
    matrix = pairs if pairs is not None else gpu_pair_matrix(topo)
    indices = [int(name.removeprefix("GPU")) for name in matrix.names]
    if len(indices) < 2:
        return GpuRing(order=tuple(indices), bottleneck_gbps=float("inf"), uniform=True)
    bw = matrix.bandwidth()
    values = {bw[i][j] for i in range(len(indices)) for j in range(len(indices)) if i != j}
    ring = optimize_ring(bw, matrix.latency())
    return GpuRing(
        order=tuple(indices[i] for i in ring.order),
        bottleneck_gbps=ring.bottleneck_gbps,
        uniform=len(values) == 1,
    )


def render_graph_file(topo: topology_pb2.NodeTopology, ring: GpuRing, *, expert: bool, nchannels: int = 2) -> str:
    """An ``NCCL_GRAPH_FILE`` with one ring graph (id 0, pattern 4) following ``ring``.

    Channels alternate direction; each starts and ends at the NIC nearest its first GPU. Only for one node type
    and one local GPU set: a file whose GPU count differs from the job's makes NCCL fail ("dev N not found").
    """
    if not expert:
        raise ExpertModeRequired(
            "an NCCL graph file pins NCCL's intra-node search and is for experiments only; "
            "pass expert=True to render one"
        )
    if nchannels < 1:
        raise ValueError(f"nchannels must be at least 1, got {nchannels}")
    links = {(link.gpu_a, link.gpu_b): link for link in topo.gpu_links}
    order = list(ring.order)
    kinds = [links.get((min(a, b), max(a, b))) for a, b in zip(order, order[1:] + order[:1], strict=True) if a != b]
    worst = max((k.kind for k in kinds if k is not None), key=closeness, default=topology_pb2.LINK_KIND_SELF)
    type_intra = nccl_path_type(worst) if len(order) > 1 else "LOC"
    nic_index = {nic.name: i for i, nic in enumerate(topo.nics)}

    def nearest_nic(gpu: int) -> int | None:
        affinities = [a for a in topo.nic_affinities if a.gpu == gpu and a.nic in nic_index]
        if not affinities:
            return None
        return nic_index[min(affinities, key=lambda a: closeness(a.kind)).nic]

    speed = ring.bottleneck_gbps / nchannels if ring.bottleneck_gbps != float("inf") else 0.0
    lines = ['<graphs version="1">']
    lines.append(
        f'  <graph id="0" pattern="4" crossnic="0" nchannels="{nchannels}" speedintra="{speed:g}" '
        f'speedinter="{speed:g}" latencyinter="0" typeintra="{type_intra}" typeinter="PIX" samechannels="1">'
    )
    for channel in range(nchannels):
        gpus = order if channel % 2 == 0 else [order[0], *reversed(order[1:])]
        nic = nearest_nic(gpus[0])
        lines.append("    <channel>")
        if nic is not None:
            lines.append(f'      <net dev="{nic:x}"/>')
        lines.extend(f'      <gpu dev="{gpu:x}"/>' for gpu in gpus)
        if nic is not None:
            lines.append(f'      <net dev="{nic:x}"/>')
        lines.append("    </channel>")
    lines.append("  </graph>")
    lines.append("</graphs>")
    return "\n".join(lines) + "\n"
