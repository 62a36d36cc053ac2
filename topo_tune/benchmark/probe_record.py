"""A probe round as the controller reports it, the request that starts one, and a measured node pair.

The controller's probe service takes ``ProbeRequest`` and returns ``ProbeRound`` and ``PairMeasurement``; the
admin API's messages are converted at the edges. Non-goals: planning pairs (``topology.sampling``), the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

__all__ = ["PairMeasurement", "ProbeRequest", "ProbeRound", "ProbeStatus"]


class ProbeStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class ProbeRequest:
    nodes: tuple[str, ...] = ()
    """Empty: every ready, undrained node."""
    message_bytes: int = 0
    """Bandwidth size; 0: 16 MiB."""
    pair_deadline_s: int = 0
    sampling: str = ""
    """full, sparse; empty: sparse above 64 nodes, else full."""
    pairs: tuple[tuple[str, str], ...] = ()
    """Set: probe exactly these pairs (leave nodes and sampling unset)."""


@dataclass(frozen=True)
class PairMeasurement:
    node_a: str
    node_b: str
    bandwidth_gbps: float
    """GB/s: sendrecv algbw at the round's message size."""
    latency_us: float
    method: str
    measured_at: datetime


@dataclass(frozen=True)
class ProbeRound:
    round_id: str
    status: ProbeStatus
    message: str
    nodes: tuple[str, ...]
    sampling: str
    """full, sparse, or listed (the request named the pairs)."""
    rounds: int = 0
    """Rounds of disjoint pairs."""
    pairs_total: int = 0
    """Pairs planned (sparse: so far)."""
    measurements: tuple[PairMeasurement, ...] = ()
    degraded_nodes: tuple[str, ...] = ()
    """Sparse: nodes slow with every peer (their NIC)."""
    degraded_uplinks: tuple[str, ...] = ()
    """Sparse: racks slow with every other rack (their uplink)."""
    slow_pairs: tuple[tuple[str, str], ...] = ()
    """Sparse: single slow pairs neither explains (a cable, a port)."""
