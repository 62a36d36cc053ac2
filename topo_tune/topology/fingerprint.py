"""Topology fingerprints: a stable hash of what matters for tuning.

Purpose: results and configs are keyed by a fingerprint so a study found on one node type applies to every node of
that type. The hash covers the GPU models, the GPU↔GPU link graph, NUMA placement, PCIe generation/width and the
NICs with their GPU affinity. It leaves out everything that differs between identical machines or between two
discoveries of one machine: serials (UUIDs, GUIDs, host hashes), hostnames, bus ids, the order devices were listed
in, software versions (results are keyed by those separately) and the wording of unknowns.
Non-goals: a graph-isomorphism canonical form. Each device is described by its own properties plus the multiset of
its links, which tells apart every topology NCCL tunes differently that we know of; two non-isomorphic graphs with
identical per-device neighbourhoods would share a fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from topo_tune.topology.levels import link_label
from topo_tune.v1 import topology_pb2

FINGERPRINT_VERSION = "tf1"


def _opt(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


def _gpu_key(gpu: topology_pb2.Gpu) -> tuple[Any, ...]:
    return (
        gpu.name,
        gpu.sm_arch if gpu.HasField("sm_arch") else None,
        _opt(gpu, "memory_bytes"),
        _opt(gpu, "pcie_gen_max"),
        _opt(gpu, "pcie_width_max"),
        _opt(gpu, "numa_node"),
    )


def _nic_key(nic: topology_pb2.Nic) -> tuple[Any, ...]:
    return (nic.link_layer, _opt(nic, "rate_gbps"), _opt(nic, "gdr"), _opt(nic, "numa_node"))


def canonical_form(topo: topology_pb2.NodeTopology) -> dict[str, Any]:
    """The order-free description the fingerprint hashes (also handy to diff two nodes)."""
    gpu_by_index = {g.index: g for g in topo.gpus}
    nic_by_name = {n.name: n for n in topo.nics}
    links: dict[int, list[str]] = {g.index: [] for g in topo.gpus}
    edges: list[tuple[Any, ...]] = []
    for link in topo.gpu_links:
        label = link_label(link.kind, link.nvlink_count if link.HasField("nvlink_count") else None)
        if link.via_nvswitch:
            label += "/sw"
        for end in (link.gpu_a, link.gpu_b):
            links.setdefault(end, []).append(label)
        if link.gpu_a in gpu_by_index and link.gpu_b in gpu_by_index:
            ends = sorted([_gpu_key(gpu_by_index[link.gpu_a]), _gpu_key(gpu_by_index[link.gpu_b])], key=repr)
            edges.append((*ends, label))
    nic_aff: dict[str, list[str]] = {}
    for aff in topo.nic_affinities:
        nic_aff.setdefault(aff.nic, []).append(link_label(aff.kind))
    gpus = sorted(
        (repr((_gpu_key(g), sorted(links.get(g.index, [])))) for g in topo.gpus),
    )
    nics = sorted(repr((_nic_key(n), sorted(nic_aff.get(n.name, [])))) for n in nic_by_name.values())
    return {
        "gpus": gpus,
        "gpu_edges": sorted(repr(e) for e in edges),
        "nics": nics,
        "numa_nodes": _opt(topo, "numa_node_count"),
        "cpus": topo.cpu_count,
        "virtualized": _opt(topo, "virtualized"),
    }


def _digest(payload: Any) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def topology_fingerprint(topo: topology_pb2.NodeTopology) -> str:
    """``tf1-<20 hex>``: equal for nodes of the same hardware layout, whatever their serials or listing order."""
    return f"{FINGERPRINT_VERSION}-{_digest(canonical_form(topo))}"


def cluster_fingerprint(node_fingerprints_by_rack: Iterable[Iterable[str]]) -> str:
    """A fingerprint of a whole cluster: the multiset of racks, each a multiset of node fingerprints."""
    racks = sorted(json.dumps(sorted(rack)) for rack in node_fingerprints_by_rack)
    return f"{FINGERPRINT_VERSION}c-{_digest(racks)}"
