"""The inter-node side of a simulated job: what the NICs, the spine and the probes let through.

Purpose: a ``NetView`` per job, as the truth (QP caches, TCP streams, ECMP hashing onto spine paths, rack
uplinks and rack-pair caps, probed node pairs, PXN/cross-NIC rail changes) or as NCCL's nominal view (NIC
rates only); and the uplink load a ring's or a tree's edges put on each rack (``spine_load``).

Non-goals: intra-node links, algorithm and protocol choice, message sizes (``model``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from topo_tune.sim.cluster import Cluster, Node, Transport
from topo_tune.sim.knobs import NcclKnobs

# A NIC reaches this share of its line rate through NCCL (NDR 400G -> ~47.5 GB/s).
_NIC_EFF: Final = {Transport.IB: 0.95, Transport.ROCE: 0.93, Transport.SOCKET: 0.9}
# One TCP stream of NCCL's socket transport, GB/s, and the CPU cost of each extra stream.
_SOCKET_STREAM_GBS: Final = 1.1
_SOCKET_STREAM_COST: Final = 0.004
# Queue pairs a NIC holds before its context cache thrashes, and the slowdown per doubling beyond.
_QP_CACHE: Final = 256
_QP_PENALTY: Final = 0.25
# Extra NVLink hop of a PXN relay, µs.
_PXN_LAT: Final = 1.0


@dataclass(frozen=True)
class NetView:
    """The inter-node side of a job as one observer sees it (the truth, or NCCL's nominal view)."""

    nic_gbs: float  # one NIC of the weakest node, after transport/QP effects
    nics: int  # NICs per node NCCL spreads channels over (fewest among the nodes)
    ring_hop_cap_gbs: float  # slowest ring hop's cap from spine shares, rack pairs and probes (aggregate)
    ring_hop_lat_us: float  # extra latency of the slowest ring hop
    tree_cap_gbs: float  # tree algorithm-bandwidth cap from spine shares of crossing tree edges
    tree_lat_us: float
    sendrecv_cap_gbs: float  # the slowest node-boundary sendrecv pair's cap
    sendrecv_lat_us: float
    alltoall_spine_gbs: float  # spine capacity for alltoall traffic of the busiest rack (aggregate)
    alltoall_cross_share: float  # share of a node's alltoall network bytes that leave its rack
    alltoall_lat_us: float
    p2p_qp_eff: float  # QP-cache effect of alltoall's many connections


def _ecmp_efficiency(paths: int, flows: float) -> float:
    """Throughput share left after hashing ``flows`` onto ``paths`` equal-cost paths (max-load estimate)."""
    if paths <= 1:
        return 1.0
    return 1.0 / (1.0 + math.sqrt(2.0 * paths * math.log(paths) / max(flows, 1.0)))


def _qp_efficiency(qps_per_nic: float) -> float:
    if qps_per_nic <= _QP_CACHE:
        return 1.0
    return 1.0 / (1.0 + _QP_PENALTY * max(0.0, math.log2(qps_per_nic / _QP_CACHE)))


def _nic_gbs(node: Node, knobs: NcclKnobs, channels: int, nics: int) -> float:
    """What one NIC of ``node`` delivers through NCCL with these knobs (before the spine)."""
    rate = min(nic.line_rate_gbps for nic in node.nics[:nics]) / 8.0
    transport = node.transport
    if transport is Transport.SOCKET:
        # Each channel's connection runs SOCKET_NTHREADS x NSOCKS_PERTHREAD TCP streams.
        streams = math.ceil(channels / nics) * knobs.socket_nthreads * knobs.nsocks_perthread
        gbs = min(rate * _NIC_EFF[transport], streams * _SOCKET_STREAM_GBS)
        return gbs / (1.0 + _SOCKET_STREAM_COST * streams)
    qps = math.ceil(channels / nics) * knobs.ib_qps_per_connection * 2
    return rate * _NIC_EFF[transport] * _qp_efficiency(qps)


@dataclass(frozen=True)
class SpineLoad:
    """How a set of edges (ring hops, tree edges) loads the racks' uplinks; independent of the knobs.

    Each edge carries ``weight`` x the rate being capped. An edge between racks puts all of it on the
    spine, an edge inside a rack ``rail_share`` of it (traffic that changes rail on a rail-optimized
    fabric). ``groups`` are the distinct (rack from, rack to, share) of edges that touch the spine.
    """

    weight: float
    groups: tuple[tuple[str, str, float], ...]
    out_load: dict[str, float]
    in_load: dict[str, float]
    pair_load: dict[tuple[str, str], float]


def spine_load(
    racks: Sequence[str], edges: Sequence[tuple[int, int]], *, weight: float, rail_share: float
) -> SpineLoad:
    """Sum the uplink loads of ``edges`` between node indices whose racks are ``racks``."""
    out_load: dict[str, float] = {}
    in_load: dict[str, float] = {}
    pair_load: dict[tuple[str, str], float] = {}
    groups: set[tuple[str, str, float]] = set()
    for a, b in edges:
        ra, rb = racks[a], racks[b]
        share = 1.0 if ra != rb else rail_share
        if not share:
            continue
        groups.add((ra, rb, share))
        out_load[ra] = out_load.get(ra, 0.0) + share * weight
        in_load[rb] = in_load.get(rb, 0.0) + share * weight
        if ra != rb:
            pair_load[(ra, rb)] = pair_load.get((ra, rb), 0.0) + weight
    return SpineLoad(weight, tuple(sorted(groups)), out_load, in_load, pair_load)


def _spine_caps(cluster: Cluster, load: SpineLoad, *, flows_per_edge: float) -> tuple[float, float]:
    """(cap, extra latency) of the worst edge of ``load``, each edge hashing ``flows_per_edge`` flows."""
    spine = cluster.spine
    if spine is None or not load.groups:
        return math.inf, cluster.switch_latency_us
    cap = math.inf
    for ra, rb, share in load.groups:
        out_load, in_load = load.out_load[ra], load.in_load[rb]
        flows = flows_per_edge * max(out_load, in_load) / load.weight
        eff = _ecmp_efficiency(spine.ecmp_paths, flows)
        edge_cap = min(cluster.rack_uplink_gbs(ra) * eff / out_load, cluster.rack_uplink_gbs(rb) * eff / in_load)
        if ra != rb:
            edge_cap = min(edge_cap, cluster.rack_pair_gbs(ra, rb) * eff / load.pair_load[(ra, rb)])
        cap = min(cap, edge_cap / share)
    return cap, cluster.switch_latency_us + spine.latency_us


def _cached_load(cluster: Cluster, order: tuple[str, ...], racks: list[str], kind: str, rail_share: float) -> SpineLoad:
    """The spine load of the ring or the trees over ``order`` (cached on the cluster: orders repeat)."""
    key = ("spine-load", order, kind, rail_share)
    load = cluster.cache.get(key)
    if load is None:
        n = len(order)
        if kind == "ring":
            load = spine_load(racks, [(i, (i + 1) % n) for i in range(n)], weight=1.0, rail_share=rail_share)
        else:
            # Double binary tree over node indices: a heap and its mirror, both directions, half the data each.
            edges = [(i, (i - 1) // 2) for i in range(1, n)]
            edges += [(n - 1 - i, n - 1 - (i - 1) // 2) for i in range(1, n)]
            edges += [(b, a) for a, b in edges]
            load = spine_load(racks, edges, weight=0.5, rail_share=rail_share)
        cluster.cache[key] = load
    assert isinstance(load, SpineLoad)
    return load


def net_view(cluster: Cluster, nodes: list[Node], knobs: NcclKnobs, channels: int, *, truth: bool) -> NetView:
    """The inter-node side of the job. ``truth=False`` is NCCL's view: NIC rates only."""
    n = len(nodes)
    gpus = nodes[0].gpus
    nranks = n * gpus
    nics = min(len(node.nics) for node in nodes)
    # Nodes of one build share their NIC tuple; evaluate each distinct one once (1000-node clusters).
    distinct = {cluster.nic_class(node.name): node for node in nodes}
    if not truth:
        # NCCL's graph knows NIC speeds, not QP caches or how many TCP streams a connection opens.
        nic_gbs = min(
            min(nic.line_rate_gbps for nic in node.nics[:nics]) / 8.0 * _NIC_EFF[node.transport]
            for node in distinct.values()
        )
        lat = cluster.switch_latency_us
        return NetView(nic_gbs, nics, math.inf, lat, math.inf, lat, math.inf, lat, math.inf, 0.0, lat, 1.0)
    nic_gbs = min(_nic_gbs(node, knobs, channels, nics) for node in distinct.values())
    spine = cluster.spine
    racks = [node.rack for node in nodes]
    qps = knobs.ib_qps_per_connection if nodes[0].transport is not Transport.SOCKET else 1
    flow_factor = qps * (2 if knobs.ib_split_data_on_qps else 1)
    rail_fabric = cluster.rail_optimized and spine is not None
    # CROSS_NIC=1 on a rail-optimized fabric lets rings leave on another rail: about half the traffic
    # of every hop then climbs to the spine, even between nodes of one rack.
    ring_rail = 0.5 if (knobs.cross_nic == 1 and rail_fabric) else 0.0
    order = tuple(node.name for node in nodes)
    ring_cap, ring_lat = _spine_caps(
        cluster, _cached_load(cluster, order, racks, "ring", ring_rail), flows_per_edge=channels * flow_factor
    )
    if cluster.measured:
        for i in range(n):
            probe = cluster.measurement(order[i], order[(i + 1) % n])
            if probe is not None:
                ring_cap = min(ring_cap, probe.bandwidth_gbs)
                ring_lat = max(ring_lat, probe.latency_us)
    tree_cap, tree_lat = _spine_caps(
        cluster, _cached_load(cluster, order, racks, "tree", ring_rail), flows_per_edge=channels * flow_factor / 2
    )
    # p2p: without PXN a GPU sends through its own NIC, so a peer on another rail is reached through
    # the spine; with PXN the data first crosses NVLink to the GPU on the peer's rail (one more hop).
    p2p_rail = 0.5 if (knobs.pxn_disable and rail_fabric) else 0.0
    per_peer_flows = min(knobs.nchannels_per_net_peer, channels) * flow_factor
    # nccl-tests sendrecv: the last GPU of each node sends to the first GPU of the next node in order.
    sendrecv_cap, sendrecv_lat = _spine_caps(
        cluster, _cached_load(cluster, order, racks, "ring", p2p_rail), flows_per_edge=per_peer_flows
    )
    if not knobs.pxn_disable:
        sendrecv_lat += _PXN_LAT
    # alltoall is symmetric, so order does not matter: the busiest rack's uplink carries what leaves it.
    rack_nodes: dict[str, int] = {}
    for rack in racks:
        rack_nodes[rack] = rack_nodes.get(rack, 0) + 1
    a2a_share, a2a_gbs = 0.0, math.inf
    if spine is not None:
        for rack, count in rack_nodes.items():
            outside = (n - count) / (n - 1)
            share = outside + (1.0 - outside) * p2p_rail
            if share == 0.0:
                continue
            flows = count * gpus * (nranks - gpus) * per_peer_flows * share
            gbs = cluster.rack_uplink_gbs(rack) * _ecmp_efficiency(spine.ecmp_paths, flows) / count
            if a2a_share == 0.0 or gbs / share < a2a_gbs / a2a_share:
                a2a_share, a2a_gbs = share, gbs
    a2a_qps = (nranks - gpus) * gpus / nics * min(knobs.nchannels_per_net_peer, channels) * qps
    return NetView(
        nic_gbs=nic_gbs,
        nics=nics,
        ring_hop_cap_gbs=ring_cap,
        ring_hop_lat_us=ring_lat,
        tree_cap_gbs=tree_cap,
        tree_lat_us=tree_lat,
        sendrecv_cap_gbs=sendrecv_cap,
        sendrecv_lat_us=sendrecv_lat,
        alltoall_spine_gbs=a2a_gbs,
        alltoall_cross_share=a2a_share,
        alltoall_lat_us=max(ring_lat, tree_lat),
        p2p_qp_eff=_qp_efficiency(a2a_qps),
    )
