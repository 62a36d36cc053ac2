"""Random rack-structured ring problems, for the optimizer's tests and benchmark.

Purpose: instances shaped like real clusters: racks of nodes on a leaf switch, a spine between racks that is
oversubscribed, a few nodes with a degraded NIC, and a few percent of measurement noise on every pair. The seed
makes every instance reproducible. Non-goals: modelling a particular vendor's fabric.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RackInstance:
    bandwidth: list[list[float]]
    latency: list[list[float]]
    racks: list[str]


def rack_instance(
    n: int,
    *,
    rack_size: int = 32,
    seed: int,
    node_gbps: float = 400.0,
    spine_oversubscription: float = 2.0,
    degraded_share: float = 0.02,
    noise: float = 0.03,
) -> RackInstance:
    """``n`` nodes in racks of ``rack_size``; bandwidth = min of the endpoints' NIC rates (a degraded NIC runs at
    half rate), divided by the oversubscription across racks, times ``1 - U(0, noise)`` per pair."""
    rng = random.Random(seed)
    racks = [f"r{i // rack_size:03d}" for i in range(n)]
    nic = [node_gbps * (0.5 if rng.random() < degraded_share else 1.0) for _ in range(n)]
    bw = [[0.0] * n for _ in range(n)]
    lat = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            same = racks[i] == racks[j]
            rate = min(nic[i], nic[j]) / (1.0 if same else spine_oversubscription)
            rate *= 1.0 - rng.uniform(0.0, noise)
            bw[i][j] = bw[j][i] = round(rate, 3)
            hop_latency = 3.2 if same else 4.4
            lat[i][j] = lat[j][i] = round(hop_latency + rng.uniform(0.0, 0.3), 3)
    return RackInstance(bandwidth=bw, latency=lat, racks=racks)
