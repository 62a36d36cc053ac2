"""What a probe round may ask for, and what a probed pair's two results must show before they are stored.

Pure checks, each raising (or returning) a reason that names the field or the node; ``probes.py`` runs the
rounds. Non-goal: whether the named nodes exist or are ready (the service asks the registry).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from topo_tune.benchmark.probe_record import ProbeRequest
from topo_tune.errors import ValidationError
from topo_tune.v1 import agent_pb2


def listed_pairs(request: ProbeRequest) -> list[tuple[str, str]]:
    """The pairs a request names (checked: no self-pair, none twice, not mixed with nodes or sampling)."""
    listed = [(a, b) for a, b in request.pairs]
    if listed:
        if request.nodes or request.sampling:
            raise ValidationError("pairs", "give pairs, or nodes and a sampling policy, not both")
        seen: set[frozenset[str]] = set()
        for i, (a, b) in enumerate(listed):
            if a == b or frozenset((a, b)) in seen:
                raise ValidationError(f"pairs[{i}]", f"{a}-{b} pairs a node with itself or is listed twice")
            seen.add(frozenset((a, b)))
    return listed


def refused_results(pair: tuple[str, str], results: Sequence[agent_pb2.CommandResult | None]) -> str:
    """Why a pair's two results cannot be stored (a node failed, or reported figures no link has); "" if fine."""
    a, b = pair
    for node, result in zip(pair, results, strict=True):
        if result is None or result.status != agent_pb2.COMMAND_STATUS_SUCCEEDED or not result.HasField("probe"):
            why = result.message if result is not None else "no result by the deadline"
            return f"{a}-{b}: {node}: {why}"
        figures = {"bandwidth_gbps": result.probe.bandwidth_gbps, "latency_us": result.probe.latency_us}
        for name, value in figures.items():
            # The measured matrix replaces the model's figures everywhere; no link has these.
            if not (math.isfinite(value) and value > 0):
                return f"{a}-{b}: {node}: reported {name} {value}, which no link has"
    return ""
