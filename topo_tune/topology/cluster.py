"""The cluster model: nodes grouped into racks, an optional spine, and its views.

Purpose: what the controller knows about the cluster's shape. It is built from the nodes' `NodeTopology` and a
plain ``node -> rack`` mapping (from ``cluster.yaml`` or a Kubernetes node label, parsed elsewhere), with the
spine's oversubscription when the operator gives it, and the network tiers above each node's rack where its
labels name them (a spine block: ``kube.rack``), which the modelled node pairs climb. It renders the
``admin topology`` views: the cluster as racks (table or JSON) and one node's matrix.
Non-goals: parsing configuration files; talking to agents.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from google.protobuf import json_format

from topo_tune.errors import ClusterModelError
from topo_tune.topology.distance import PairMatrix, node_injection_gbps, node_pair_matrix
from topo_tune.topology.fingerprint import cluster_fingerprint, topology_fingerprint
from topo_tune.topology.levels import link_label
from topo_tune.topology.matrix import render_node_matrix
from topo_tune.v1 import topology_pb2

DEFAULT_RACK = "default"


@dataclass(frozen=True)
class Spine:
    """The layer between racks: how much slower a cross-rack path is than a rack's own links.

    ``oversubscription`` divides a node's own rate across the spine (4 for a 4:1 spine); ``bandwidth_gbps``, when
    known, caps what one node gets across it, in Gb/s like NIC rates. Mirrors ``cluster.yaml``'s ``spine``.
    """

    oversubscription: float = 1.0
    bandwidth_gbps: float | None = None

    def __post_init__(self) -> None:
        if self.oversubscription < 1.0:
            raise ClusterModelError(f"spine.oversubscription must be >= 1, got {self.oversubscription}")
        if self.bandwidth_gbps is not None and self.bandwidth_gbps <= 0:
            raise ClusterModelError(f"spine.bandwidth_gbps must be positive, got {self.bandwidth_gbps}")


@dataclass(frozen=True)
class Rack:
    name: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class ClusterTopology:
    racks: tuple[Rack, ...]
    nodes: Mapping[str, topology_pb2.NodeTopology]
    spine: Spine | None = None
    fingerprints: Mapping[str, str] = field(default_factory=dict)
    tiers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """node → the network tiers above its rack, top first (none known: absent)."""

    @property
    def rack_of(self) -> dict[str, str]:
        return {node: rack.name for rack in self.racks for node in rack.nodes}

    @property
    def fingerprint(self) -> str:
        return cluster_fingerprint([self.fingerprints[n] for n in rack.nodes] for rack in self.racks)

    def node_order(self) -> tuple[str, ...]:
        """Nodes rack by rack, in rack then node name order (the "naive" order of a hostfile)."""
        return tuple(node for rack in self.racks for node in rack.nodes)

    def node_pairs(self) -> PairMatrix:
        """The modelled node-to-node bandwidth/latency matrix (see `topo_tune.topology.distance`)."""
        order = self.node_order()
        return node_pair_matrix(
            order,
            injection_gbps={name: node_injection_gbps(self.nodes[name]) for name in order},
            rack_of=self.rack_of,
            tiers_of=self.tiers,
            spine_oversubscription=self.spine.oversubscription if self.spine else 1.0,
            spine_gbps=self.spine.bandwidth_gbps if self.spine else None,
        )


def build_cluster(
    nodes: Mapping[str, topology_pb2.NodeTopology],
    rack_of: Mapping[str, str],
    *,
    spine: Spine | None = None,
    default_rack: str | None = DEFAULT_RACK,
    tiers_of: Mapping[str, tuple[str, ...]] | None = None,
) -> ClusterTopology:
    """Group nodes into racks. A rack named for an unknown node is an error naming it; a node without a rack goes
    to ``default_rack``, or is an error when ``default_rack`` is None. ``tiers_of``: node → the tiers above its
    rack, top first (a node left out has none)."""
    for node in rack_of:
        if node not in nodes:
            raise ClusterModelError(f"rack mapping names node {node!r}, which has no topology")
    members: dict[str, list[str]] = {}
    for node in nodes:
        rack = rack_of.get(node, default_rack)
        if rack is None:
            raise ClusterModelError(f"node {node!r} has no rack")
        if not rack:
            raise ClusterModelError(f"node {node!r} has an empty rack name")
        members.setdefault(rack, []).append(node)
    racks = tuple(Rack(name=name, nodes=tuple(sorted(members[name]))) for name in sorted(members))
    return ClusterTopology(
        racks=racks,
        nodes=dict(nodes),
        spine=spine,
        fingerprints={name: topology_fingerprint(topo) for name, topo in nodes.items()},
        tiers={node: tuple(t) for node, t in (tiers_of or {}).items() if node in nodes and t},
    )


def racks_from_labels(labels: Mapping[str, Mapping[str, str]], *, label: str) -> dict[str, str]:
    """``node -> rack`` from Kubernetes node labels (e.g. ``topology.kubernetes.io/zone``); unlabelled nodes are
    left out, so `build_cluster` puts them in the default rack."""
    return {node: values[label] for node, values in labels.items() if values.get(label)}


# --- views -------------------------------------------------------------------------------------------------


def _gpu_summary(topo: topology_pb2.NodeTopology) -> str:
    if not topo.gpus:
        return "no GPUs"
    names: dict[str, int] = {}
    for gpu in topo.gpus:
        names[gpu.name or "?"] = names.get(gpu.name or "?", 0) + 1
    kinds: dict[str, int] = {}
    for link in topo.gpu_links:
        label = link_label(link.kind, link.nvlink_count if link.HasField("nvlink_count") else None)
        kinds[label] = kinds.get(label, 0) + 1
    gpus = ", ".join(f"{count}x {name}" for name, count in sorted(names.items()))
    links = " ".join(f"{label}:{count}" for label, count in sorted(kinds.items()))
    return gpus + (f" [{links}]" if links else "")


def _nic_summary(topo: topology_pb2.NodeTopology) -> str:
    if not topo.nics:
        return "no NICs"
    rates: dict[str, int] = {}
    for nic in topo.nics:
        layer = topology_pb2.NicLinkLayer.Name(nic.link_layer).removeprefix("NIC_LINK_LAYER_")
        rate = f"{nic.rate_gbps:g}G" if nic.HasField("rate_gbps") else "?G"
        key = f"{rate} {layer}"
        rates[key] = rates.get(key, 0) + 1
    return ", ".join(f"{count}x {key}" for key, count in sorted(rates.items()))


def _rack_tiers(cluster: ClusterTopology, rack: Rack) -> list[tuple[str, ...]]:
    """The distinct tiers above ``rack`` its nodes name, top first each (one, unless labels disagree)."""
    return sorted({cluster.tiers[n] for n in rack.nodes if n in cluster.tiers})


def render_cluster(cluster: ClusterTopology) -> str:
    """The cluster as racks: one line per node with its GPUs, links, NICs, fingerprint and unknown count."""
    lines = [f"Cluster {cluster.fingerprint}: {len(cluster.nodes)} nodes in {len(cluster.racks)} racks"]
    if cluster.spine is not None:
        uplink = (
            f", at most {cluster.spine.bandwidth_gbps:g} Gb/s per node across it"
            if cluster.spine.bandwidth_gbps
            else ""
        )
        lines.append(f"Spine: oversubscription {cluster.spine.oversubscription:g}:1{uplink}")
    for rack in cluster.racks:
        lines.append("")
        above = ", ".join("/".join(tiers) for tiers in _rack_tiers(cluster, rack))
        lines.append(f"Rack {rack.name} ({len(rack.nodes)} nodes{f', under {above}' if above else ''})")
        width = max(len(n) for n in rack.nodes)
        for name in rack.nodes:
            topo = cluster.nodes[name]
            unknown = f"{len(topo.unknowns)} unknown" if topo.unknowns else "all known"
            lines.append(
                f"  {name.ljust(width)}  {_gpu_summary(topo)}; {_nic_summary(topo)}; "
                f"{cluster.fingerprints[name]}; {unknown}"
            )
    return "\n".join(lines) + "\n"


def node_to_dict(topo: topology_pb2.NodeTopology) -> dict[str, Any]:
    """The full `NodeTopology` as JSON-ready data (proto field names, defaults included)."""
    data: dict[str, Any] = json_format.MessageToDict(
        topo, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return data


def cluster_to_dict(
    cluster: ClusterTopology, node_data: Callable[[topology_pb2.NodeTopology], dict[str, Any]] = node_to_dict
) -> dict[str, Any]:
    """The cluster as JSON-ready data; ``node_data`` turns each node's `NodeTopology` into data."""
    return {
        "fingerprint": cluster.fingerprint,
        "spine": None
        if cluster.spine is None
        else {
            "oversubscription": cluster.spine.oversubscription,
            "bandwidth_gbps": cluster.spine.bandwidth_gbps,
        },
        "racks": [
            {"name": rack.name, "nodes": list(rack.nodes)}
            | ({"tiers": [list(t) for t in tiers]} if (tiers := _rack_tiers(cluster, rack)) else {})
            for rack in cluster.racks
        ],
        "nodes": {
            name: {"fingerprint": cluster.fingerprints[name], "topology": node_data(cluster.nodes[name])}
            for name in cluster.node_order()
        },
    }


def admin_topology_data(
    cluster: ClusterTopology,
    *,
    node: str | None = None,
    node_data: Callable[[topology_pb2.NodeTopology], dict[str, Any]] = node_to_dict,
) -> dict[str, Any]:
    """What ``topo-tune admin topology [NODE] --output json|yaml`` prints: the whole cluster, or one node with
    its rack, fingerprint and full `NodeTopology`. Raises `ClusterModelError` naming an unknown node."""
    _check_node(cluster, node)
    if node is None:
        return cluster_to_dict(cluster, node_data)
    return {
        "node": node,
        "rack": cluster.rack_of[node],
        "fingerprint": cluster.fingerprints[node],
        "topology": node_data(cluster.nodes[node]),
    }


def _check_node(cluster: ClusterTopology, node: str | None) -> None:
    if node is not None and node not in cluster.nodes:
        known = ", ".join(cluster.node_order())
        raise ClusterModelError(f"unknown node {node!r}; known nodes: {known}")


def render_admin_topology(
    cluster: ClusterTopology, *, node: str | None = None, output: Literal["table", "json"] = "table"
) -> str:
    """What ``topo-tune admin topology [NODE] [--output json]`` prints.

    Without ``node``: the cluster as racks (table) or the whole cluster (JSON). With ``node``: that node's
    `nvidia-smi topo -m`-style matrix (table) or its full `NodeTopology` (JSON). Raises `ClusterModelError`
    naming an unknown node.
    """
    _check_node(cluster, node)
    if output == "json":
        return json.dumps(admin_topology_data(cluster, node=node), indent=2) + "\n"
    if output != "table":
        raise ClusterModelError(f"output must be 'table' or 'json', got {output!r}")
    if node is None:
        return render_cluster(cluster)
    header = f"Rack {cluster.rack_of[node]}, fingerprint {cluster.fingerprints[node]}\n"
    return header + render_node_matrix(cluster.nodes[node])
