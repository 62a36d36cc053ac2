"""A rollout's plan: the waves, built from the cluster's racks before anything is applied.

The first wave is a canary (``canary_nodes`` nodes of the first rack, or the whole rack ``canary_rack``);
then the remaining nodes go rack by rack in natural rack order (``rack-2`` before ``rack-10``),
``max_parallel_racks`` racks per wave.
Where nodes name the network tiers above their rack (a node's **path**: e.g. spine, block, then rack, from the
Topograph, EKS or GKE labels; ``kube.rack``), racks are grouped by those tiers: the groups go in natural order
(a spine's blocks together), each group's racks one after another, and a wave never holds racks of two groups,
so a fault in one spine block shows before the next block is touched. A rack's group is the tiers most of its
nodes name (ties: the first in natural order); racks without tiers come after the groups. Without tiers
(every node placed by its rack alone) the order is the racks' own.
A node that is not in any rack, in a cluster that has racks, is skipped and listed with why: a wave of its
own would gate a stray (often lost) node as if it were a rack. A cluster without any racks is one rack ``""``.
The plan is deterministic (same nodes and policy, same waves), so a restarted controller that rebuilds it
gets the same answer, and it is rendered as a table for the operator to read before it starts.

Non-goals: applying anything (``engine.py``) and judging a wave (``gates.py``).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from topo_tune.config.checks import validated
from topo_tune.config.cluster import RolloutGateConfig
from topo_tune.errors import ValidationError

MAX_PAUSE_S = 30 * 86400.0
"""The longest pause between waves: longer is a typo, and an unbounded one cannot be scheduled."""


class WaveKind(StrEnum):
    CANARY = "canary"
    RACKS = "racks"


@dataclass(frozen=True)
class PlanPolicy:
    canary_nodes: int = 1
    """Nodes in the canary wave (taken from the first rack); 0 with no ``canary_rack`` means no canary."""
    canary_rack: str = ""
    """A whole rack as the canary wave (instead of ``canary_nodes``)."""
    max_parallel_racks: int = 1
    pause_between_s: float = 0.0
    """Wait this long after a wave's gate passes before the next wave starts."""
    require_approval: bool = False
    """Pause after every successful wave until an operator promotes."""
    gate: RolloutGateConfig = field(default_factory=RolloutGateConfig)
    """What each wave's gate measures (fixed when the rollout is created)."""

    def __post_init__(self) -> None:
        if self.canary_nodes < 0:
            raise ValidationError("canary_nodes", "must be 0 or more")
        if self.max_parallel_racks < 1:
            raise ValidationError("max_parallel_racks", "must be at least 1")
        if not 0 <= self.pause_between_s <= MAX_PAUSE_S:  # NaN too: a wave's resume time must be a real date
            raise ValidationError(
                "pause_between_s", f"must be 0 to {MAX_PAUSE_S:g} s (30 days), got {self.pause_between_s:g}"
            )

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {**dataclasses.asdict(self), "gate": self.gate.model_dump()}

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> PlanPolicy:
        """From the stored form (``to_json``); a rollout stored before gates were configurable has no ``gate``
        and gets the defaults."""
        gate = validated(RolloutGateConfig, values.get("gate", {}), where="gate", error=ValidationError)
        return cls(**{**values, "gate": gate})


@dataclass(frozen=True)
class Wave:
    index: int
    kind: WaveKind
    racks: tuple[str, ...]
    nodes: tuple[str, ...]
    group: tuple[str, ...] = ()
    """The network tiers above the wave's racks, top first (``()``: none known)."""


NetworkPath = str | tuple[str, ...]
"""Where a node sits: its rack, or the tiers above its rack (top first) then the rack, e.g.
``("spine-1", "block-2", "rack-7")``."""

NO_RACK = "no rack, in a cluster of racks: give it one (--rack, cluster.yaml or the rack label) to include it"


@dataclass(frozen=True)
class RolloutPlan:
    waves: tuple[Wave, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    """(node, why) for each node the plan leaves out."""

    def wave_of(self) -> dict[str, int]:
        """Node name → index of its wave."""
        return {node: wave.index for wave in self.waves for node in wave.nodes}

    def render(self) -> str:
        """A table for the operator: one line per wave (with the wave's network group where nodes name tiers)."""
        groups = ["/".join(w.group) or "-" for w in self.waves]
        shown = any(w.group for w in self.waves)
        width = max([len("group"), *map(len, groups)]) if shown else 0
        group_head = f"{'group':<{width}}  " if shown else ""
        lines = [f"{'wave':>4}  {'kind':<6}  {'nodes':>5}  {group_head}racks"]
        for wave, group in zip(self.waves, groups, strict=True):
            racks = ", ".join(r or "(no rack)" for r in wave.racks)
            cell = f"{group:<{width}}  " if shown else ""
            lines.append(f"{wave.index:>4}  {wave.kind.value:<6}  {len(wave.nodes):>5}  {cell}{racks}")
        total = sum(len(w.nodes) for w in self.waves)
        lines.append(f"{len(self.waves)} waves, {total} nodes")
        lines.extend(f"skipped {node}: {why}" for node, why in self.skipped)
        return "\n".join(lines)


def natural_key(rack: str) -> tuple[int, tuple[tuple[int, str], ...]]:
    """Natural order (``r2`` < ``r10``); the empty rack sorts last."""
    parts = tuple((0, p) if not p.isdigit() else (1, f"{int(p):020d}") for p in re.split(r"(\d+)", rack) if p)
    return (1 if rack == "" else 0, parts)


def group_key(group: tuple[str, ...]) -> tuple[int, tuple[tuple[int, tuple[tuple[int, str], ...]], ...]]:
    """Natural order of groups of racks (top tier first); racks without tiers (``()``) sort last."""
    return (1 if not group else 0, tuple(natural_key(tier) for tier in group))


def _groups(path_of: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Rack → the tiers above it that most of its nodes name (ties: the first in natural order)."""
    votes: dict[str, Counter[tuple[str, ...]]] = {}
    for path in path_of.values():
        votes.setdefault(path[-1], Counter())[path[:-1]] += 1
    return {rack: min(count, key=lambda g: (-count[g], group_key(g))) for rack, count in votes.items()}


def build_plan(placement: Mapping[str, NetworkPath], policy: PlanPolicy) -> RolloutPlan:
    """Waves for the nodes ``placement`` names (node → rack, or node → path: see `NetworkPath`). Raises
    ``ValidationError`` naming the option."""
    if not placement:
        raise ValidationError("nodes", "the cluster has no nodes to roll out to")
    path_of = {node: (path,) if isinstance(path, str) else (tuple(path) or ("",)) for node, path in placement.items()}
    by_rack: dict[str, list[str]] = {}
    for node, path in path_of.items():
        by_rack.setdefault(path[-1], []).append(node)
    skipped: tuple[tuple[str, str], ...] = ()
    if "" in by_rack and len(by_rack) > 1:
        skipped = tuple((node, NO_RACK) for node in sorted(by_rack.pop(""), key=natural_key))
    covered = sum(len(nodes) for nodes in by_rack.values())
    if policy.canary_nodes > covered and not policy.canary_rack:
        raise ValidationError(
            "canary_nodes", f"{policy.canary_nodes} canary nodes, more than the {covered} the rollout covers"
        )
    group_of = _groups({node: path for node, path in path_of.items() if path[-1] in by_rack})
    racks = sorted(by_rack, key=lambda rack: (group_key(group_of[rack]), natural_key(rack)))
    for rack in racks:
        by_rack[rack].sort(key=natural_key)
    waves = _canary(by_rack, racks, policy)
    if waves:
        waves[0] = dataclasses.replace(waves[0], group=group_of[waves[0].racks[0]])
    for group in sorted({group_of[rack] for rack in racks}, key=group_key):
        members = [rack for rack in racks if group_of[rack] == group]
        for start in range(0, len(members), policy.max_parallel_racks):
            chunk = tuple(members[start : start + policy.max_parallel_racks])
            nodes = tuple(node for rack in chunk for node in by_rack[rack])
            waves.append(Wave(len(waves), WaveKind.RACKS, chunk, nodes, group))
    return RolloutPlan(tuple(waves), skipped)


def _canary(by_rack: dict[str, list[str]], racks: list[str], policy: PlanPolicy) -> list[Wave]:
    """The canary wave, taken out of ``by_rack`` and ``racks`` (a rack it empties leaves ``racks``)."""
    if policy.canary_rack:
        if policy.canary_rack not in by_rack:
            raise ValidationError("canary_rack", f"no rack named {policy.canary_rack!r}; racks: {', '.join(racks)}")
        racks.remove(policy.canary_rack)
        return [Wave(0, WaveKind.CANARY, (policy.canary_rack,), tuple(by_rack.pop(policy.canary_rack)))]
    if not policy.canary_nodes:
        return []
    first = racks[0]
    if policy.canary_nodes >= len(by_rack[first]) and len(racks) > 1:
        racks.remove(first)
        return [Wave(0, WaveKind.CANARY, (first,), tuple(by_rack.pop(first)))]
    canary, by_rack[first] = by_rack[first][: policy.canary_nodes], by_rack[first][policy.canary_nodes :]
    if not by_rack[first]:
        racks.remove(first)
    return [Wave(0, WaveKind.CANARY, (first,), tuple(canary))]
