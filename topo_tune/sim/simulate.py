"""The simulator's entry point: one collective over a size ladder, for one environment and rank order.

``simulate`` is cheap enough to sit inside a search loop (size-independent work is cached per cluster,
order and environment). Every result says ``simulated=True``; :func:`to_benchmark_result` turns it into
the wire message the real backends send, with the flag set.

Noise is seeded: the same inputs and seed give the same figures. Draws follow the size ladder, so two
environments simulated with one seed see the same noise (common random numbers); pass different seeds to
get independent repeats.

Non-goals: running anything on hardware, and the nccl-tests sweep arithmetic (``-b -e -f``): callers pass
the sizes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from topo_tune.benchmark.collectives import bus_factor
from topo_tune.errors import SimInputError
from topo_tune.nccl.collectives import Collective
from topo_tune.sim.cluster import Cluster
from topo_tune.sim.knobs import parse_env
from topo_tune.sim.model import offered, run
from topo_tune.sim.plan import CollectivePlan, build_plan
from topo_tune.v1 import agent_pb2

DTYPE_BYTES: Mapping[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
}
_PLAN_CACHE_LIMIT = 4096
# Per-iteration spread relative to the spread of a mean over iterations (what the noise draws).
_ITER_SPREAD = 2.0
_Z99 = 2.326


@dataclass(frozen=True)
class SimSizeResult:
    """One size of a simulated sweep, in nccl-tests' terms. All figures are simulated."""

    bytes: int
    count: int
    time_us: float  # with seeded noise, as a measurement would report it
    algbw_gbs: float
    busbw_gbs: float
    p50_us: float
    p99_us: float
    cv: float  # per-iteration coefficient of variation, a fraction
    model_time_us: float  # the same time without noise
    algorithm: str  # what NCCL would have run, e.g. "Ring"
    protocol: str
    channels: int
    offered: tuple[str, ...] = ()  # the entries NCCL's cost table allows, "algorithm/protocol" in tuner-table names
    nccl: str = ""  # NCCL's own pick in those names (differs from algorithm/protocol where a tuner row applied)
    row_channels: int = 0  # the channel count a tuner row set; 0: none did


@dataclass(frozen=True)
class SimResult:
    """A simulated sweep of one collective. ``simulated`` is always true."""

    collective: Collective
    nranks: int
    nodes: int
    rank_order: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    seed: int
    dtype: str
    sizes: tuple[SimSizeResult, ...]
    simulated: Literal[True] = True


def simulate(
    cluster: Cluster,
    *,
    collective: Collective | str,
    sizes: Sequence[int],
    env: Mapping[str, str],
    rank_order: Sequence[str],
    seed: int,
    dtype: str = "float32",
) -> SimResult:
    """Simulate ``collective`` at each of ``sizes`` bytes (nccl-tests' size semantics).

    ``rank_order`` lists the job's nodes; ranks are contiguous per node and the inter-node ring follows
    this order, as NCCL's does. ``env`` is the job's environment (NCCL reads it; non-NCCL keys are
    ignored). Raises :class:`SimInputError` naming the bad argument or variable.
    """
    coll = _collective(collective)
    order = tuple(rank_order)
    if not order:
        raise SimInputError("rank_order", "must name at least one node")
    if len(set(order)) != len(order):
        raise SimInputError("rank_order", "names a node twice")
    if dtype not in DTYPE_BYTES:
        raise SimInputError("dtype", f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SimInputError("seed", f"must be an integer, got {seed!r}")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SimInputError("sizes", f"every size must be a positive integer, got {size!r}")
    plan = plan_for(cluster, order, env)
    rng = random.Random(seed)
    type_bytes = DTYPE_BYTES[dtype]
    factor = bus_factor(coll, plan.nranks)
    entries = tuple(entry_name(a.value, p.value) for a, p in offered(plan, coll))
    results = []
    for size in sizes:
        choice = run(plan, coll, size)
        sigma = plan.profile.cv * (1.0 + 2.0 / (1.0 + size / 65536.0))
        time_us = choice.time_us * math.exp(rng.gauss(0.0, sigma))
        iter_sigma = sigma * _ITER_SPREAD
        algbw = size / (time_us * 1e3)
        results.append(
            SimSizeResult(
                bytes=size,
                count=size // type_bytes,
                time_us=time_us,
                algbw_gbs=algbw,
                busbw_gbs=algbw * factor,
                p50_us=time_us * math.exp(-iter_sigma * iter_sigma / 2.0),
                p99_us=time_us * math.exp(_Z99 * iter_sigma - iter_sigma * iter_sigma / 2.0),
                cv=math.sqrt(math.expm1(iter_sigma * iter_sigma)),
                model_time_us=choice.time_us,
                algorithm=choice.algorithm.value,
                protocol=choice.protocol.value,
                channels=choice.channels,
                offered=entries,
                nccl=entry_name(choice.algorithm.value, choice.protocol.value) if entries else "",
            )
        )
    return SimResult(
        collective=coll,
        nranks=plan.nranks,
        nodes=plan.nodes,
        rank_order=order,
        env=tuple(sorted(env.items())),
        seed=seed,
        dtype=dtype,
        sizes=tuple(results),
    )


# The model's (NCCL_ALGO/NCCL_PROTO) spellings -> the tuner table's.
_TABLE_ALGORITHM: Mapping[str, str] = {"Ring": "ring", "Tree": "tree", "NVLS": "nvls", "NVLSTree": "nvls_tree"}
_TABLE_PROTOCOL: Mapping[str, str] = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}


def entry_name(algorithm: str, protocol: str) -> str:
    """``"Ring", "LL128"`` as the tuner table and the plugin's record spell it: ``ring/ll128``."""
    return f"{_TABLE_ALGORITHM[algorithm]}/{_TABLE_PROTOCOL[protocol]}"


def plan_for(cluster: Cluster, order: tuple[str, ...], env: Mapping[str, str]) -> CollectivePlan:
    """The cached size-independent model state for a job (kept on the cluster object)."""
    knobs = parse_env(env)
    key = (order, knobs)
    cache = cluster.cache
    plan = cache.get(key)
    if plan is None:
        plan = build_plan(cluster, order, knobs)
        if len(cache) >= _PLAN_CACHE_LIMIT:
            cache.clear()
        cache[key] = plan
    assert isinstance(plan, CollectivePlan)
    return plan


def to_benchmark_result(result: SimResult, *, job_id: str, rank: int = 0) -> agent_pb2.BenchmarkResult:
    """The wire form of a simulated sweep, labelled ``simulated=True``."""
    return agent_pb2.BenchmarkResult(
        job_id=job_id,
        rank=rank,
        simulated=True,
        effective_env=dict(result.env),
        sizes=[
            agent_pb2.SizeResult(
                bytes=s.bytes,
                count=s.count,
                time_us=s.time_us,
                algbw_gbps=s.algbw_gbs,
                busbw_gbps=s.busbw_gbs,
                wrong=0,
                p50_us=s.p50_us,
                p99_us=s.p99_us,
                cv=s.cv,
                choice=choice_of(s),
            )
            for s in result.sizes
        ],
    )


def choice_of(size: SimSizeResult) -> agent_pb2.NcclChoice | None:
    """The wire form of what the model's NCCL offered and ran at one size; None where no tuner is asked."""
    if not size.offered:
        return None
    return agent_pb2.NcclChoice(
        offered=list(size.offered),
        nccl=size.nccl,
        applied=entry_name(size.algorithm, size.protocol),
        channels=size.row_channels,
    )


def _collective(value: Collective | str) -> Collective:
    if isinstance(value, Collective):
        return value
    try:
        return Collective(value)
    except ValueError:
        known = ", ".join(c.value for c in Collective)
        raise SimInputError("collective", f"unknown collective {value!r}; known: {known}") from None
