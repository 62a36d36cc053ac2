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

The size-independent part of a job is its ``CollectivePlan`` (``plan``), the inter-node side a ``NetView``
(``network``).

Non-goals: cycle accuracy, congestion from other jobs, CollNet/SHARP/PAT, NCCL's exact per-version
constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from topo_tune.errors import SimInputError
from topo_tune.nccl.collectives import Collective
from topo_tune.sim.cluster import GpuProfile
from topo_tune.sim.knobs import MAX_THREADS, Algorithm, NcclKnobs, Protocol
from topo_tune.sim.network import NetView
from topo_tune.sim.plan import CollectivePlan

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
# Tree bandwidth refinement of tuning.cc (busBw * .9).
_TREE_EFF: Final = 0.9
# Soft-minimum sharpness between CTA throughput and link bandwidth (fitted, docs/sim.md).
_SOFTMIN_P: Final = 4.0
_SOCKET_LAT_FACTOR: Final = 4.0
# Latency of splitting each message across QPs (NCCL_IB_SPLIT_DATA_ON_QPS=1), per QP.
_SPLIT_LAT_PER_QP: Final = 0.05
# Per-channel rate of a network p2p connection relative to a collective CTA (a plain copy, no reduction).
_P2P_NET_CTA_FACTOR: Final = 1.5
# Cost of NCCL_BUFFSIZE beyond the default: setup latency per doubling, µs (2x H200: ~+1 µs at 16 MiB).
_BUFFSIZE_LAT_PER_DOUBLING: Final = 0.4
_DEFAULT_BUFFSIZE: Final = 4 * 1024 * 1024


@dataclass(frozen=True)
class SimulatedChoice:
    """What NCCL ran for one size and how long it took (before noise)."""

    time_us: float
    algorithm: Algorithm
    protocol: Protocol
    channels: int


def run(plan: CollectivePlan, collective: Collective, size: int) -> SimulatedChoice:
    """NCCL's choice for ``size`` bytes and its true time."""
    if plan.nranks == 1:
        return SimulatedChoice(plan.profile.launch_overhead_us + 2.0, _RING, _SIMPLE, 1)
    if collective.point_to_point:
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
    return SimulatedChoice(time_us, algo, proto, nc)


def offered(plan: CollectivePlan, collective: Collective) -> list[tuple[Algorithm, Protocol]]:
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


def _candidates(plan: CollectivePlan, collective: Collective) -> list[tuple[Algorithm, Protocol]]:
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
    plan: CollectivePlan,
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
    nthreads = plan.nthreads if (algo is _RING and proto is not _LL128) else MAX_THREADS
    # enqueue.cc: fewer channels while each would get less than nthreads*threshold bytes; MIN_CTAS floors it.
    # (NCCL also scales the LL ring threshold by nranks; with the model's LL rate that starves mid-size
    # messages of channels on 8-GPU nodes, so the model keeps the plain threshold.)
    nc = max(plan.min_channels, min(plan.channels, size // (nthreads * _THREAD_THRESHOLD[proto])))
    if nominal:
        nc = plan.channels
    # Fewer threads per CTA move less, a little better than linearly (fit: measured 2x H200 run).
    thread_factor = (nthreads / MAX_THREADS) ** 0.62 if (proto is not _LL128 and not nominal) else 1.0
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
    elif collective in (Collective.BROADCAST, Collective.REDUCE):  # a pipelined chain through every rank
        nsteps, inter_steps, link_bytes = nranks - 1, n - 1, float(size)
    else:  # point-to-point is priced by _p2p; a collective added to the enum must be modelled here first
        raise SimInputError("collective", f"the model has no algorithm for {collective.value}")
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


def _nvls_time(plan: CollectivePlan, net: NetView | None, size: int) -> float:
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


def _p2p(plan: CollectivePlan, collective: Collective, size: int) -> SimulatedChoice:
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
    return SimulatedChoice(latency + max(t_intra, t_net), _RING, _SIMPLE, nc)


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
