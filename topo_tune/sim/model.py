"""The analytic cost model: how long one NCCL collective takes on a cluster, for one environment and order.

Shape (details and calibration in ``docs/sim.md``):

* **Selection like NCCL.** For each algorithm/protocol the environment allows, a *nominal* time is computed
  from what NCCL knows (its graph: NIC rates, NVLink, channel count; not the spine, ECMP collisions or
  probes). The smallest wins, as in ``src/graph/tuning.cc`` + ``enqueue.cc``. The *true* time of that
  choice is then computed with everything the cluster description knows, so NCCL can choose badly.
* **α–β with chunking.** time = latency (NCCL's base + per-step hardware latency, per-step counts from
  ``tuning.cc``) + chunks × (chunk / per-channel bandwidth + per-chunk overhead). Chunks come from
  ``NCCL_BUFFSIZE`` (Simple), fixed LL/LL128 buffers, or the p2p chunk sizes.
* **Bandwidth** is a soft minimum of what the CTAs can push (channels × per-CTA rate × threads factor ×
  protocol efficiency) and what the slowest link gives (NVLink/PCIe, the ring's worst inter-node hop:
  NICs, probe, spine share under ECMP hashing, rack-pair caps).
* **Ring order** enters through the hops: a ring over nodes is as fast as its slowest hop, and hops that
  cross the spine share their racks' uplinks. Trees are built over node indices, so order moves their
  edges too.

Non-goals: cycle accuracy, congestion from other jobs, CollNet/SHARP/PAT, NCCL's exact per-version
constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from topo_tune.benchmark.collectives import Collective
from topo_tune.errors import SimInputError
from topo_tune.sim.cluster import Cluster, FabricKind, GpuProfile, Node, Transport
from topo_tune.sim.knobs import MAX_CHANNELS, Algorithm, NcclKnobs, Protocol

_LL, _LL128, _SIMPLE = Protocol.LL, Protocol.LL128, Protocol.SIMPLE
_RING, _TREE, _NVLS, _NVLS_TREE = Algorithm.RING, Algorithm.TREE, Algorithm.NVLS, Algorithm.NVLS_TREE

# NCCL's base latency per algorithm and protocol, µs (shape of ``baseLat`` in src/graph/tuning.cc).
_BASE_LAT: Final = {
    _RING: {_LL: 6.6, _LL128: 8.0, _SIMPLE: 8.4},
    _TREE: {_LL: 6.8, _LL128: 8.0, _SIMPLE: 8.4},
    _NVLS: {_SIMPLE: 18.0},
    _NVLS_TREE: {_SIMPLE: 21.0},
}
# Per-step hardware latency, µs, by link class (``hwLat``): NVLink, PCIe, network.
_HW_LAT: Final = {
    "nvl": {_RING: {_LL: 0.6, _LL128: 1.25, _SIMPLE: 3.4}, _TREE: {_LL: 0.6, _LL128: 1.25, _SIMPLE: 4.0}},
    "pci": {_RING: {_LL: 1.0, _LL128: 1.9, _SIMPLE: 5.7}, _TREE: {_LL: 1.0, _LL128: 1.9, _SIMPLE: 4.0}},
    "net": {_RING: {_LL: 2.7, _LL128: 4.0, _SIMPLE: 14.0}, _TREE: {_LL: 5.0, _LL128: 8.5, _SIMPLE: 14.0}},
}
# Per-chunk synchronisation cost (flags, fences, proxy progress), µs, by the slowest link class.
_CHUNK_OVERHEAD: Final = {
    "nvl": {_LL: 0.03, _LL128: 0.15, _SIMPLE: 0.35},
    "pci": {_LL: 0.1, _LL128: 0.3, _SIMPLE: 0.7},
    "net": {_LL: 0.3, _LL128: 0.4, _SIMPLE: 1.2},
}
# Payload share of a line: LL carries 4 data bytes per 8; LL128 120 per 128.
_LINK_EFF: Final = {_LL: 0.5, _LL128: 120.0 / 128.0, _SIMPLE: 1.0}
# Per-CTA rate relative to Simple: LL threads poll flags per line, LL128 warps sync per 128 bytes.
_CTA_EFF: Final = {_LL: 0.5, _LL128: 0.92, _SIMPLE: 1.0}
# Bytes of work per thread before NCCL adds a channel (NCCL_*_THREAD_THRESHOLD; LL ring scales by nranks).
_THREAD_THRESHOLD: Final = {_LL: 4, _LL128: 8, _SIMPLE: 64}
# Fixed per-step payload of the LL and LL128 buffers (NCCL's default LL/LL128 buffer sizes / 8 steps).
_LL_STEP: Final = 32 * 1024
_LL128_STEP: Final = 560 * 1024
# all_gather / reduce_scatter kernels reach less of the link than all_reduce's (measured 2x H200
# run at 128 MiB: 231 and 225 GB/s against all_reduce's 284; NCCL's ll128MaxBwPerCh differs per collective).
_COLL_EFF: Final = {Collective.ALL_GATHER: 0.8, Collective.REDUCE_SCATTER: 0.78}
# Pipeline-fill granularity of a chain/tree hop, and the smallest Simple step NCCL shrinks to.
_FILL_GRANULE: Final = {_LL: 0, _LL128: 0, _SIMPLE: 1 << 40}
_MIN_STEP: Final = 32 * 1024
_P2P_BYTES_PER_CHANNEL: Final = 8 * 1024
# A p2p chunk is consumed in slices, so the receiver starts after the first quarter of the first chunk.
_P2P_SLICES: Final = 4
# p2p chunks shrink until each channel holds 4 x this many (fitted: NCCL's default chunks stay near optimal).
_P2P_DEPTH: Final = 1.5
_NVLS_CHUNK: Final = 128 * 1024
_NVLS_CHANNELS: Final = 16
_MAX_THREADS: Final = 512
# Tree bandwidth refinement of tuning.cc (busBw * .9).
_TREE_EFF: Final = 0.9
# Soft-minimum sharpness between CTA throughput and link bandwidth (fitted, docs/sim.md).
_SOFTMIN_P: Final = 4.0
# A NIC reaches this share of its line rate through NCCL (NDR 400G -> ~47.5 GB/s).
_NIC_EFF: Final = {Transport.IB: 0.95, Transport.ROCE: 0.93, Transport.SOCKET: 0.9}
# One TCP stream of NCCL's socket transport, GB/s, and the CPU cost of each extra stream.
_SOCKET_STREAM_GBS: Final = 1.1
_SOCKET_STREAM_COST: Final = 0.004
_SOCKET_LAT_FACTOR: Final = 4.0
# Queue pairs a NIC holds before its context cache thrashes, and the slowdown per doubling beyond.
_QP_CACHE: Final = 256
_QP_PENALTY: Final = 0.25
# Latency of splitting each message across QPs (NCCL_IB_SPLIT_DATA_ON_QPS=1), per QP.
_SPLIT_LAT_PER_QP: Final = 0.05
# Per-channel rate of a network p2p connection relative to a collective CTA (a plain copy, no reduction).
_P2P_NET_CTA_FACTOR: Final = 1.5
# Extra NVLink hop of a PXN relay, µs.
_PXN_LAT: Final = 1.0
# Cost of NCCL_BUFFSIZE beyond the default: setup latency per doubling, µs (2x H200: ~+1 µs at 16 MiB).
_BUFFSIZE_LAT_PER_DOUBLING: Final = 0.4
_DEFAULT_BUFFSIZE: Final = 4 * 1024 * 1024


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


@dataclass(frozen=True)
class Plan:
    """Everything about one (cluster, rank order, environment) that does not depend on message size."""

    nodes: int
    gpus: int
    nranks: int
    profile: GpuProfile
    knobs: NcclKnobs
    intra_gbs: float  # NVLink/PCIe ring bus-bandwidth ceiling per GPU
    intra_hw: str  # "nvl" or "pci"
    nvls_gbs: float  # NVLS algorithm bandwidth, 0 if NVLS is unavailable or disabled
    ll128: bool
    channels: int  # channel count after NCCL_MIN/MAX_CTAS
    min_channels: int  # floor of NCCL's small-message channel reduction
    nthreads: int
    socket: bool
    actual: NetView | None
    nominal: NetView | None
    # The algorithm/protocol pairs NCCL may pick, per collective (filled on first use).
    candidates: dict[Collective, list[tuple[Algorithm, Protocol]]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )


@dataclass(frozen=True)
class Choice:
    """What NCCL ran for one size and how long it took (before noise)."""

    time_us: float
    algorithm: Algorithm
    protocol: Protocol
    channels: int


def build_plan(cluster: Cluster, order: tuple[str, ...], knobs: NcclKnobs) -> Plan:
    """Precompute the size-independent part of the model for a job over ``order``'s nodes."""
    nodes = [cluster.node(name) for name in order]
    gpus = nodes[0].gpus
    for node in nodes:
        if node.gpus != gpus:
            # NCCL needs the same ranks per node (uneven counts deadlocked bootstrap, NVIDIA/nccl#2385).
            raise SimInputError("rank_order", f"node {node.name!r} has {node.gpus} GPUs, {nodes[0].name!r} has {gpus}")
    n = len(nodes)
    profile = nodes[0].profile
    fabric_kind = nodes[0].fabric.kind
    intra_line = min(node.fabric.bandwidth_gbs for node in nodes)
    intra_hw = "pci" if fabric_kind is FabricKind.PCIE else "nvl"
    if fabric_kind is FabricKind.NVLINK and gpus > 2:
        # Without a switch a ring's neighbour is reached over the links bonded to that one peer.
        intra_line /= 2
    intra_gbs = intra_line * profile.link_efficiency
    nvls = all(node.fabric.nvls for node in nodes) and gpus > 1 and knobs.nvls_enable != 0
    nvls_gbs = intra_line * profile.nvls_algbw_fraction if nvls else 0.0
    if knobs.algorithms is not None and not knobs.algorithms & {_NVLS, _NVLS_TREE}:
        nvls_gbs = 0.0
    # NCCL enables LL128 by default only where NVLink carries the ring (tuning.cc's platform gate).
    ll128 = fabric_kind is not FabricKind.PCIE or gpus == 1
    socket = any(node.transport is Transport.SOCKET for node in nodes) and n > 1
    nics = min(len(node.nics) for node in nodes)
    if n > 1 and nics == 0:
        raise SimInputError("rank_order", "a job over several nodes needs NICs on every node")
    default_channels = profile.ring_channels if n == 1 else min(MAX_CHANNELS, profile.channels_per_nic * nics)
    max_ctas = knobs.max_ctas if knobs.max_ctas is not None else MAX_CHANNELS
    min_ctas = min(knobs.min_ctas or 1, max_ctas)
    channels = max(min_ctas, min(max_ctas, default_channels))
    nthreads = knobs.nthreads or _MAX_THREADS
    actual = nominal = None
    if n > 1:
        actual = _net_view(cluster, nodes, knobs, channels, truth=True)
        nominal = _net_view(cluster, nodes, knobs, channels, truth=False)
    return Plan(
        nodes=n,
        gpus=gpus,
        nranks=n * gpus,
        profile=profile,
        knobs=knobs,
        intra_gbs=intra_gbs,
        intra_hw=intra_hw,
        nvls_gbs=nvls_gbs,
        ll128=ll128,
        channels=channels,
        min_channels=min_ctas if knobs.min_ctas is not None else 1,
        nthreads=nthreads,
        socket=socket,
        actual=actual,
        nominal=nominal,
    )


def run(plan: Plan, collective: Collective, size: int) -> Choice:
    """NCCL's choice for ``size`` bytes and its true time."""
    if plan.nranks == 1:
        return Choice(plan.profile.launch_overhead_us + 2.0, _RING, _SIMPLE, 1)
    if collective in (Collective.ALLTOALL, Collective.SENDRECV):
        return _p2p(plan, collective, size)
    best: tuple[float, Algorithm, Protocol] | None = None
    candidates = plan.candidates.get(collective)
    if candidates is None:
        candidates = plan.candidates[collective] = _candidates(plan, collective)
    for algo, proto in candidates:
        predicted = _time(plan, plan.nominal, collective=collective, algo=algo, proto=proto, size=size, nominal=True)[0]
        if best is None or predicted < best[0]:
            best = (predicted, algo, proto)
    if best is None:
        raise SimInputError("env.NCCL_ALGO", f"no enabled algorithm/protocol implements {collective.value}")
    _, algo, proto = best
    time_us, nc = _time(plan, plan.actual, collective=collective, algo=algo, proto=proto, size=size, nominal=False)
    return Choice(time_us, algo, proto, nc)


def offered(plan: Plan, collective: Collective) -> list[tuple[Algorithm, Protocol]]:
    """The algorithm/protocol entries NCCL's cost table allows for ``collective`` (not -1): what a tuner may pick.

    The same entries the model's own selection weighs (NCCL_FACTS §3: NCCL hands a tuner its cost table with
    the entries it ruled out at -1, e.g. LL128 behind its platform gate, NVLS with Simple only, and picks the
    smallest entry >= 0 from what the tuner leaves). Point-to-point collectives and one-rank jobs never reach
    a tuner (NCCL_FACTS §3, "Not covered"): none.
    """
    if plan.nranks == 1 or collective in (Collective.ALLTOALL, Collective.SENDRECV):
        return []
    candidates = plan.candidates.get(collective)
    if candidates is None:
        candidates = plan.candidates[collective] = _candidates(plan, collective)
    return list(candidates)


def _candidates(plan: Plan, collective: Collective) -> list[tuple[Algorithm, Protocol]]:
    knobs = plan.knobs
    protos = [p for p in (_LL, _LL128, _SIMPLE) if knobs.protocols is None or p in knobs.protocols]
    if knobs.protocols is None and not plan.ll128:
        protos.remove(_LL128)
    algos = [_RING]
    if collective is Collective.ALL_REDUCE:
        if plan.nodes > 1:
            algos.append(_TREE)
        if plan.nvls_gbs > 0:
            algos.append(_NVLS if plan.nodes == 1 else _NVLS_TREE)
    if knobs.algorithms is not None:
        algos = [a for a in algos if a in knobs.algorithms]
    out = []
    for algo in algos:
        for proto in protos:
            if algo in (_NVLS, _NVLS_TREE) and proto is not _SIMPLE:
                continue
            out.append((algo, proto))
    return out


def _time(
    plan: Plan,
    net: NetView | None,
    *,
    collective: Collective,
    algo: Algorithm,
    proto: Protocol,
    size: int,
    nominal: bool,
) -> tuple[float, int]:
    """Time of one algorithm/protocol in µs, and the channels it ran on.

    ``nominal`` is NCCL's own prediction: its bandwidth table counts all channels and ignores
    NCCL_NTHREADS (tuning.cc), so a thread or small-message channel choice can surprise it.
    """
    profile = plan.profile
    knobs = plan.knobs
    n, g, nranks = plan.nodes, plan.gpus, plan.nranks
    if algo in (_NVLS, _NVLS_TREE):
        return _nvls_time(plan, net, size), _NVLS_CHANNELS
    nthreads = plan.nthreads if (algo is _RING and proto is not _LL128) else _MAX_THREADS
    # enqueue.cc: fewer channels while each would get less than nthreads*threshold bytes; MIN_CTAS floors it.
    # (NCCL also scales the LL ring threshold by nranks; with the model's LL rate that starves mid-size
    # messages of channels on 8-GPU nodes, so the model keeps the plain threshold.)
    nc = max(plan.min_channels, min(plan.channels, size // (nthreads * _THREAD_THRESHOLD[proto])))
    if nominal:
        nc = plan.channels
    # Fewer threads per CTA move less, a little better than linearly (fit: measured 2x H200 run).
    thread_factor = (nthreads / _MAX_THREADS) ** 0.62 if (proto is not _LL128 and not nominal) else 1.0
    cta_gbs = nc * profile.cta_gbs * thread_factor * _CTA_EFF[proto]
    link_gbs = plan.intra_gbs if g > 1 else math.inf
    hop_lat = 0.0
    if net is not None:
        link_gbs = min(link_gbs, _net_aggregate(net, nc), net.tree_cap_gbs * 2 if algo is _TREE else math.inf)
        if algo is _RING:
            link_gbs = min(link_gbs, net.ring_hop_cap_gbs)
        hop_lat = net.ring_hop_lat_us if algo is _RING else net.tree_lat_us
    link_gbs *= _LINK_EFF[proto] * (_TREE_EFF if algo is _TREE else 1.0) * _COLL_EFF.get(collective, 1.0)
    bus_gbs = _softmin(cta_gbs, link_gbs)
    slow_hw = "net" if n > 1 else plan.intra_hw
    chunk_overhead = _CHUNK_OVERHEAD[slow_hw][proto]
    if n > 1:
        if plan.socket:
            chunk_overhead *= _SOCKET_LAT_FACTOR
        if knobs.ib_split_data_on_qps and not plan.socket:
            chunk_overhead += _SPLIT_LAT_PER_QP * knobs.ib_qps_per_connection
    step_nominal = _LL_STEP if proto is _LL else _LL128_STEP if proto is _LL128 else knobs.buffsize // 8
    hw_intra = _HW_LAT[plan.intra_hw][_TREE if algo is _TREE else _RING][proto]
    hw_net = _HW_LAT["net"][_TREE if algo is _TREE else _RING][proto] * (_SOCKET_LAT_FACTOR if plan.socket else 1.0)
    latency = _BASE_LAT[algo][proto] + _overheads(profile, knobs, nc)
    if algo is _TREE:
        depth = max(1, math.ceil(math.log2(n)))
        latency += 2 * ((g - 1) * hw_intra + depth * (hw_net + hop_lat))
        algbw = 0.5 * bus_gbs
        step = _pipeline_step(step_nominal, size / nc, 2 * (depth + g - 1), proto)
        chunks = max(1.0, size / (nc * step)) + 2 * (depth + g - 1) * min(step, _FILL_GRANULE[proto]) / step
        per_chunk = step / (algbw / nc * 1e3) + chunk_overhead
        return latency + chunks * per_chunk, nc
    if collective is Collective.ALL_REDUCE:
        nsteps, inter_steps, link_bytes = 2 * (nranks - 1), 2 * (n - 1), 2.0 * (nranks - 1) / nranks * size
    elif collective in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        nsteps, inter_steps, link_bytes = nranks - 1, n - 1, (nranks - 1) / nranks * size
    else:  # broadcast / reduce: a pipelined chain through every rank
        nsteps, inter_steps, link_bytes = nranks - 1, n - 1, float(size)
    latency += (nsteps - inter_steps) * hw_intra + inter_steps * (hw_net + hop_lat)
    if collective in (Collective.BROADCAST, Collective.REDUCE):
        step = _pipeline_step(step_nominal, size / nc, nranks - 1, proto)
        # The chain fills hop by hop; LL/LL128 forward lines as they arrive, Simple whole steps.
        chunks = max(1.0, size / (nc * step)) + (nranks - 2) * min(step, _FILL_GRANULE[proto]) / step
    else:
        step = max(1.0, min(step_nominal, size / (nc * nranks)))
        chunks = max(float(nsteps), link_bytes / (nc * step))
    per_chunk = step / (bus_gbs / nc * 1e3) + chunk_overhead
    return latency + chunks * per_chunk, nc


def _pipeline_step(nominal: int, per_channel: float, depth: float, proto: Protocol) -> float:
    """NCCL's chunk sizing: shrink Simple steps until the pipeline holds ~4 chunks per stage (enqueue.cc)."""
    step = float(nominal)
    if proto is _SIMPLE:
        while per_channel < step * 4 * depth and step > _MIN_STEP:
            step /= 2
    return max(1.0, min(step, per_channel))


def _nvls_time(plan: Plan, net: NetView | None, size: int) -> float:
    profile = plan.profile
    # The switch does the reduction (multimem loads/stores), so the CTAs are not the limit.
    algbw = plan.nvls_gbs
    latency = _BASE_LAT[_NVLS][_SIMPLE] + _overheads(profile, plan.knobs, _NVLS_CHANNELS)
    overhead = _CHUNK_OVERHEAD["nvl"][_SIMPLE]
    if net is not None:
        # NVLSTree: NVLS inside the node, a tree between nodes.
        depth = max(1, math.ceil(math.log2(plan.nodes)))
        tree_algbw = 0.5 * _TREE_EFF * min(_net_aggregate(net, plan.channels), net.tree_cap_gbs * 2)
        algbw = min(algbw, tree_algbw)
        latency = _BASE_LAT[_NVLS_TREE][_SIMPLE] + _overheads(profile, plan.knobs, _NVLS_CHANNELS)
        latency += 2 * depth * (_HW_LAT["net"][_TREE][_SIMPLE] + net.tree_lat_us)
        overhead = _CHUNK_OVERHEAD["net"][_SIMPLE]
    chunk = min(_NVLS_CHUNK, max(1.0, size / _NVLS_CHANNELS))
    chunks = max(1.0, size / (_NVLS_CHANNELS * chunk))
    return latency + chunks * (chunk / (algbw / _NVLS_CHANNELS * 1e3) + overhead)


def _p2p(plan: Plan, collective: Collective, size: int) -> Choice:
    """sendrecv (rank r sends ``size`` to r+1) and alltoall (``size / nranks`` to every rank).

    Intra-node peers go over NVLink/PCIe in NCCL_P2P_NVL_CHUNKSIZE pieces spread over the channels;
    network peers over NCCL_NCHANNELS_PER_NET_PEER connections in NCCL_P2P_NET_CHUNKSIZE pieces, each
    piece paying a proxy overhead and the first one a store-and-forward delay.
    """
    profile, knobs = plan.profile, plan.knobs
    g, nranks = plan.gpus, plan.nranks
    per_peer = float(size) if collective is Collective.SENDRECV else size / nranks
    intra_bytes = 0.0 if g == 1 else per_peer if collective is Collective.SENDRECV else per_peer * (g - 1)
    # Like collectives, small transfers use fewer channels (one per _P2P_BYTES_PER_CHANNEL).
    nc = max(plan.min_channels, min(plan.channels, math.ceil(max(intra_bytes, per_peer) / _P2P_BYTES_PER_CHANNEL)))
    latency = _BASE_LAT[_RING][_SIMPLE] + _overheads(profile, knobs, nc)
    t_intra = 0.0
    if intra_bytes > 0:
        intra_gbs = _softmin(nc * profile.cta_gbs, plan.intra_gbs)
        chunk = _pipeline_step(knobs.p2p_nvl_chunksize, intra_bytes / nc, _P2P_DEPTH, _SIMPLE)
        t_intra = (
            _HW_LAT[plan.intra_hw][_RING][_SIMPLE]
            + intra_bytes / (intra_gbs * 1e3)
            + math.ceil(intra_bytes / (nc * chunk)) * _CHUNK_OVERHEAD[plan.intra_hw][_SIMPLE]
            + chunk / _P2P_SLICES / (intra_gbs / nc * 1e3)
        )
    t_net = 0.0
    net = plan.actual
    if net is not None:
        lat_factor = _SOCKET_LAT_FACTOR if plan.socket else 1.0
        hw = _HW_LAT["net"][_RING][_SIMPLE] * lat_factor
        overhead = _CHUNK_OVERHEAD["net"][_SIMPLE] * lat_factor
        if knobs.ib_split_data_on_qps and not plan.socket:
            overhead += _SPLIT_LAT_PER_QP * knobs.ib_qps_per_connection
        peer_channels = min(knobs.nchannels_per_net_peer, nc)
        conn_gbs = peer_channels * profile.cta_gbs * _P2P_NET_CTA_FACTOR
        chunk = _pipeline_step(knobs.p2p_net_chunksize, per_peer / peer_channels, _P2P_DEPTH, _SIMPLE)
        if collective is Collective.SENDRECV:
            # One GPU pair per node boundary, through one NIC.
            pair_gbs = _softmin(conn_gbs, min(net.nic_gbs, net.sendrecv_cap_gbs))
            t_net = (
                hw
                + net.sendrecv_lat_us
                + per_peer / (pair_gbs * 1e3)
                + math.ceil(per_peer / (peer_channels * chunk)) * overhead
                + chunk / _P2P_SLICES / (pair_gbs / peer_channels * 1e3)
            )
        else:
            node_bytes = per_peer * (nranks - g) * g
            t_nic = node_bytes / (net.nic_gbs * net.nics * net.p2p_qp_eff * 1e3)
            t_spine = node_bytes * net.alltoall_cross_share / (net.alltoall_spine_gbs * 1e3)
            # Every rank's pieces to its network peers share its channels; each piece pays the overhead.
            pieces = (nranks - g) * math.ceil(per_peer / chunk)
            t_net = (
                hw
                + net.alltoall_lat_us
                + max(t_nic, t_spine)
                + pieces * overhead / nc
                + chunk / _P2P_SLICES / (min(conn_gbs, net.nic_gbs) * 1e3)
            )
    return Choice(latency + max(t_intra, t_net), _RING, _SIMPLE, nc)


def _overheads(profile: GpuProfile, knobs: NcclKnobs, nc: int) -> float:
    """Per-collective costs that come from the host and launch, not from moving data.

    The small-message penalty fades with NCCL_MIN_CTAS, not with the channels launched: in the measured
    VM run the default path paid it up to 512 KB even with many channels, and forcing >= 16 CTAs lifted it.
    """
    floor = knobs.min_ctas or 1
    fade = 1.0 / (1.0 + (floor / 11.0) ** 4)
    extra = profile.launch_overhead_us + profile.small_msg_cta_penalty_us * fade + profile.per_cta_us * (nc - 1)
    if knobs.buffsize > _DEFAULT_BUFFSIZE:
        extra += _BUFFSIZE_LAT_PER_DOUBLING * math.log2(knobs.buffsize / _DEFAULT_BUFFSIZE)
    return extra


def _net_aggregate(net: NetView, nc: int) -> float:
    """Inter-node bandwidth of ``nc`` channels spread round-robin over the NICs (the busiest NIC limits)."""
    used = min(nc, net.nics)
    per_nic_channels = math.ceil(nc / used)
    return net.nic_gbs * nc / per_nic_channels


def _softmin(a: float, b: float) -> float:
    if math.isinf(b):
        return a
    if math.isinf(a):
        return b
    p = _SOFTMIN_P
    return float((a**-p + b**-p) ** (-1.0 / p))


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


def _net_view(cluster: Cluster, nodes: list[Node], knobs: NcclKnobs, channels: int, *, truth: bool) -> NetView:
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
