"""The cluster's racks and network tiers as Slurm topology: ``topology.conf`` (tree or block) or ``topology.yaml``.

Slurm places a job on as few switches (topology/tree) or blocks (topology/block) as it can; handing it the
fabric topo-tune knows (racks, the tiers above them from the nodes' labels) lets it pack jobs where links are
fast. Each rack is a leaf switch (tree) or a base block (block); each tier value above it is a switch; when the
top holds more than one switch a root joins them (Slurm's tree cannot place a job across unconnected switches).
Every switch carries, as a comment, the slowest measured node pair whose traffic crosses it, where known.

Forms and the Slurm release that reads them: ``tree`` (topology.conf, every release), ``block``
(topology.conf, 23.11+), ``yaml`` (topology.yaml, 25.05+: the tree as the cluster default and the blocks).

Non-goals: measuring (probe rounds do), BlockSizes/LinkSpeed (Slurm's defaults apply), hostlist compression.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from topo_tune.errors import ConfigError

SlurmForm = Literal["tree", "block", "yaml"]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""What a node, rack or tier name may be to be written into Slurm's files (no spaces, '#', '=', ',' or '[')."""
ROOT_NAMES = ("root", "topo-tune-root")
"""The name of the switch joining several top-level switches: the first one not taken by a rack or tier."""


@dataclass
class Switch:
    name: str
    nodes: list[str] = field(default_factory=list)
    switches: list[str] = field(default_factory=list)
    slowest_gbps: float | None = None
    measured_pairs: int = 0

    def comments(self, indent: str = "") -> list[str]:
        """The measured bandwidth as a comment line, or none when no measured pair crosses the switch."""
        if self.slowest_gbps is None:
            return []
        pairs = f"{self.measured_pairs} pair{'s' if self.measured_pairs != 1 else ''}"
        return [f"{indent}# {self.name}: slowest measured node pair across it {self.slowest_gbps:.2f} GB/s ({pairs})"]


@dataclass(frozen=True)
class SwitchTree:
    """Switches bottom-up (racks by name, then each tier once its children are listed, the root last);
    ``racks`` are the leaf switches' names."""

    switches: tuple[Switch, ...]
    racks: tuple[str, ...]

    def leaves(self) -> list[Switch]:
        return [s for s in self.switches if s.name in self.racks]

    def measured(self) -> bool:
        return any(s.slowest_gbps is not None for s in self.switches)


def switch_tree(
    rack_of: Mapping[str, str],
    tiers_of: Mapping[str, Sequence[str]],
    pairs: Iterable[tuple[str, str, float]] = (),
) -> SwitchTree:
    """Build the switches from node → rack, node → tiers above its rack (top first), and measured pairs
    (node a, node b, GB/s; pairs naming other nodes are ignored).

    Raises:
        ConfigError: a node without a rack, a rack whose nodes disagree on its tiers, or one name used for two
            switches (a tier value that is also a rack, or a tier under two parents); the message names them.
    """
    if not rack_of:
        raise ConfigError("nodes", "no nodes with a rack: nothing to export")
    unracked = sorted(node for node, rack in rack_of.items() if not rack)
    if unracked:
        raise ConfigError("rack", f"{', '.join(unracked[:5])} ha{'s' if len(unracked) == 1 else 've'} no rack")
    paths: dict[str, tuple[str, ...]] = {}
    for node in sorted(rack_of):
        rack = rack_of[node]
        path = (*tiers_of.get(node, ()), rack)
        bad = [name for name in (node, *path) if not _NAME.fullmatch(name)]
        if bad:
            raise ConfigError("nodes", f"{bad[0][:80]!r} (of node {node[:80]!r}) is not a name Slurm's files can hold")
        if paths.setdefault(rack, path) != path:
            raise ConfigError(
                "tiers", f"rack {rack}: {node} is under {'/'.join(path[:-1]) or 'no tier'}, others under "
                f"{'/'.join(paths[rack][:-1]) or 'no tier'}"
            )  # fmt: skip
    parent = _parents(paths)
    tops = sorted({path[0] for path in paths.values()})
    switches: dict[str, Switch] = {}
    if len(tops) > 1:
        taken = set(parent) | set(tops)
        root = next((name for name in ROOT_NAMES if name not in taken), None)
        if root is None:
            raise ConfigError("racks", f"{' and '.join(ROOT_NAMES)} are both racks or tiers: no name for the root")
        switches[root] = Switch(root, switches=tops)
        for top in tops:
            parent[top] = root
    for path in sorted(paths.values(), key=len):
        for depth, name in enumerate(path):
            switches.setdefault(name, Switch(name))
            if depth and name not in switches[path[depth - 1]].switches:
                switches[path[depth - 1]].switches.append(name)
    for node in sorted(rack_of):
        switches[rack_of[node]].nodes.append(node)
    _measure(switches, parent, rack_of, pairs)
    ordered = sorted(switches.values(), key=lambda s: (_height(s.name, switches), s.name))
    return SwitchTree(tuple(ordered), tuple(sorted(paths)))


def _parents(paths: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    parent: dict[str, str] = {}
    depth: dict[str, int] = {}
    for rack, path in paths.items():
        for level, name in enumerate(path):
            if depth.setdefault(name, level) != level or (name in paths and name != rack):
                raise ConfigError("tiers", f"{name!r} names two switches (a rack and a tier, or tiers of two levels)")
            if level and parent.setdefault(name, path[level - 1]) != path[level - 1]:
                raise ConfigError(
                    "tiers", f"{name!r} is under both {parent[name]!r} and {path[level - 1]!r}: tier values must be "
                    "unique across the cluster"
                )  # fmt: skip
    return parent


def _height(name: str, switches: Mapping[str, Switch]) -> int:
    """0 for a rack, else one more than its highest child switch."""
    children = switches[name].switches
    return 1 + max(_height(child, switches) for child in children) if children else 0


def _ancestry(rack: str, parent: Mapping[str, str]) -> list[str]:
    chain = [rack]
    while chain[-1] in parent:
        chain.append(parent[chain[-1]])
    return chain


def _measure(
    switches: Mapping[str, Switch],
    parent: Mapping[str, str],
    rack_of: Mapping[str, str],
    pairs: Iterable[tuple[str, str, float]],
) -> None:
    """Give each switch the slowest measured pair whose lowest common switch it is."""
    for node_a, node_b, gbps in pairs:
        if node_a not in rack_of or node_b not in rack_of or node_a == node_b or not gbps > 0:
            continue
        above_b = set(_ancestry(rack_of[node_b], parent))
        common = next(name for name in _ancestry(rack_of[node_a], parent) if name in above_b)
        switch = switches[common]
        switch.measured_pairs += 1
        switch.slowest_gbps = gbps if switch.slowest_gbps is None else min(switch.slowest_gbps, gbps)


def render(tree: SwitchTree, form: SlurmForm, *, source: str) -> str:
    """The Slurm file for ``form``; ``source`` says where the racks came from (a comment on top)."""
    command = f"topo-tune topology export --format slurm-{form}"
    head = [f"# Slurm {_FILES[form]},", f"# written by `{command}` from {source}."]
    if tree.measured():
        head.append("# Bandwidths: sendrecv GB/s of topo-tune's probe rounds, the slowest pair crossing each switch.")
    else:
        head.append("# No measured node pairs: no bandwidths.")
    body = {"tree": _tree_conf, "block": _block_conf, "yaml": _yaml}[form](tree)
    return "\n".join([*head, *body]) + "\n"


_FILES: Mapping[SlurmForm, str] = {
    "tree": "topology.conf for TopologyPlugin=topology/tree",
    "block": "topology.conf for TopologyPlugin=topology/block (Slurm 23.11+)",
    "yaml": "topology.yaml (Slurm 25.05+; topology.conf is then ignored)",
}


def _tree_conf(tree: SwitchTree) -> list[str]:
    lines = []
    for switch in tree.switches:  # leaves first, as Slurm's examples list them
        children = f"Nodes={','.join(switch.nodes)}" if switch.nodes else f"Switches={','.join(switch.switches)}"
        lines += [*switch.comments(), f"SwitchName={switch.name} {children}"]
    return lines


def _block_conf(tree: SwitchTree) -> list[str]:
    lines = ["# One base block per rack; the tiers above a rack are left to Slurm's default BlockSizes."]
    for rack in tree.leaves():
        lines += [*rack.comments(), f"BlockName={rack.name} Nodes={','.join(rack.nodes)}"]
    return lines


def _yaml(tree: SwitchTree) -> list[str]:
    lines = ["- topology: topo-tune-tree", "  cluster_default: true", "  tree:", "    switches:"]
    for switch in tree.switches:
        key, children = ("nodes", switch.nodes) if switch.nodes else ("children", switch.switches)
        lines += [*switch.comments("      "), f"      - switch: {switch.name}"]
        lines.append(f"        {key}: {json.dumps(','.join(children))}")
    lines += ["- topology: topo-tune-block", "  cluster_default: false", "  block:", "    blocks:"]
    for rack in tree.leaves():
        lines += [*rack.comments("      "), f"      - block: {rack.name}"]
        lines.append(f"        nodes: {json.dumps(','.join(rack.nodes))}")
    return lines
