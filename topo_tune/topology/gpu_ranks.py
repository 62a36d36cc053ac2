"""How many benchmark ranks an nccl job places on a node: each GPU times the agent's ranks per GPU.

An agent normally runs one rank per GPU. Its ``--ranks-per-gpu N`` test and development mode (NCCL >= 2.30,
which lets several ranks share a GPU) reports N in the node's topology, and the controller then places N ranks
on each GPU, so one GPU runs real multi-rank NCCL. ``MAX_RANKS_PER_GPU`` bounds what a node may report.

Non-goals: which GPU a rank runs on (the agent's launcher), whether the NCCL allows it (the agent checks).
"""

from __future__ import annotations

from topo_tune.v1 import topology_pb2

__all__ = ["MAX_RANKS_PER_GPU", "gpu_ranks"]

MAX_RANKS_PER_GPU = 8
"""More ranks than this on one GPU measure the GPU's scheduler, not NCCL."""


def gpu_ranks(topology: topology_pb2.NodeTopology) -> int:
    """Ranks an nccl job places on the node (0 when it reported no GPU)."""
    return len(topology.gpus) * max(1, topology.ranks_per_gpu)
