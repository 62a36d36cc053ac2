"""What a node-to-node probe reads on a simulated cluster: the pair's bandwidth and latency.

Purpose: the ``sim`` stand-in for a probe round, so probe planning (sparse sampling, its escalation) and the
ring optimiser can be exercised on clusters of thousands of nodes. A pair's bandwidth (GB/s, one direction)
is the slower node's injection rate, NCCL splitting traffic evenly over its rails so the slowest NIC paces them
all; across racks it is also capped by each rack's uplink share per node (oversubscription, degraded
uplinks) and by a rack pair's spine capacity. Latency: NIC plus switch hops, plus the spine's when crossing.
Non-goals: contention between concurrent probes and per-pair noise (a caller adds its own).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from topo_tune.sim.cluster import Cluster

NIC_LATENCY_US = 2.0
"""Send plus receive cost of one transfer through a NIC pair."""


def node_injection_gbs(cluster: Cluster, name: str) -> float:
    """What ``name`` can send, GB/s: its NIC count times its slowest NIC's line rate."""
    nics = cluster.node(name).nics
    return len(nics) * min(nic.line_rate_gbps for nic in nics) / 8.0 if nics else 0.0


def pair_matrices(cluster: Cluster) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(bandwidth GB/s, latency µs) for every pair of ``cluster.node_names``; diagonal inf and 0."""
    names = cluster.node_names
    injection = np.array([node_injection_gbs(cluster, n) for n in names])
    racks = [cluster.node(n).rack for n in names]
    rack_names = list(dict.fromkeys(racks))
    rack_idx = np.array([rack_names.index(r) for r in racks])
    counts = np.bincount(rack_idx, minlength=len(rack_names))
    per_node_uplink = np.array([cluster.rack_uplink_gbs(r) for r in rack_names]) / counts
    bandwidth = np.minimum(injection[:, None], injection[None, :])
    cross = rack_idx[:, None] != rack_idx[None, :]
    if cluster.spine is not None:
        up = per_node_uplink[rack_idx]
        bandwidth = np.where(cross, np.minimum(bandwidth, np.minimum(up[:, None], up[None, :])), bandwidth)
        for pair in cluster.spine.rack_pairs:
            a, b = rack_names.index(pair.rack_a), rack_names.index(pair.rack_b)
            block = np.outer(rack_idx == a, rack_idx == b)
            block |= block.T
            bandwidth = np.where(block, np.minimum(bandwidth, pair.bandwidth_gbs), bandwidth)
    hop = cluster.switch_latency_us
    spine_lat = cluster.spine.latency_us if cluster.spine is not None else 0.0
    latency = np.where(cross, NIC_LATENCY_US + 2 * hop + spine_lat, NIC_LATENCY_US + hop)
    np.fill_diagonal(bandwidth, np.inf)
    np.fill_diagonal(latency, 0.0)
    return bandwidth.astype(np.float64), latency.astype(np.float64)
