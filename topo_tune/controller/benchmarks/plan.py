r"""Benchmark jobs from the controller's side: plan a rank map, aggregate results, pair probes.

Pure planning (no gRPC, no I/O; agents' result messages in, plain values out), so it is tested and timed without agents:

- ``plan_job`` places ranks node by node in the job's node order, contiguous per node and the
  same number on every node (NCCL orders its inter-node ring by the nodes' first ranks, and
  uneven ranks per node have deadlocked NCCL's bootstrap, NCCL_FACTS §2.5); the rendezvous is
  rank 0's node at a port the caller found free; every rank gets the same environment;
- ``aggregate`` folds per-rank results into one figure per size and placement: the slowest
  rank's time (a collective finishes when its last rank does), bandwidths recomputed from it,
  wrong elements summed;
- ``summarize`` folds the nodes' ``CommandResult``\s of one job into its outcome: timed out
  (with the ranks that hung and the ranks the rendezvous still waited for), failed (a failed
  rank or a wrong element anywhere) or succeeded, with the aggregated rows;
- ``probe_rounds`` pairs n nodes into rounds of disjoint pairs (the circle method of a
  round-robin tournament): n-1 rounds for even n (n for odd), each pair exactly once, so a
  full probe matrix takes O(n) rounds of parallel probes instead of n(n-1)/2 serial ones.

Non-goals: sending commands, persistence, choosing ports (the caller owns sockets).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from topo_tune.benchmark.collectives import bandwidth, shape
from topo_tune.benchmark.dtypes import DType
from topo_tune.benchmark.job_record import JobStatus
from topo_tune.benchmark.job_spec import BenchmarkSpec, RankSlot
from topo_tune.benchmark.results import RankResult, SizeMeasurement
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.errors import SpecError
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import rank_result_from_proto

__all__ = [
    "JobNode",
    "JobSummary",
    "aggregate",
    "missing_ranks",
    "plan_job",
    "probe_rounds",
    "summarize",
]


@dataclass(frozen=True, slots=True)
class JobNode:
    """A node taking part in a job, in rank order."""

    name: str
    address: str
    """Where other nodes reach it (the rendezvous host when it holds rank 0)."""
    slots: int
    """GPUs for nccl; worker processes it may run for gloo."""


def plan_job(
    *,
    job_id: str,
    collective: Collective,
    sweep: SizeSweep,
    dtype: DType,
    nodes: Sequence[JobNode],
    rendezvous_port: int,
    env: Mapping[str, str],
    gpu_devices: bool,
    ranks_per_node: int | None = None,
    warmup_iters: int = 5,
    iters: int = 20,
    placements: tuple[bool, ...] = (False, True),
    check: bool = True,
    tuner_table: str = "",
    cuda_graph: bool = False,
) -> BenchmarkSpec:
    """The job's spec; ``SpecError`` names the argument when the nodes cannot hold it."""
    if not nodes:
        raise SpecError("nodes is empty")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise SpecError(f"nodes lists a node twice: {names}")
    per_node = min(n.slots for n in nodes) if ranks_per_node is None else ranks_per_node
    if per_node < 1:
        raise SpecError(f"ranks_per_node must be >= 1, got {per_node}")
    short = [n.name for n in nodes if n.slots < per_node]
    if short:
        raise SpecError(f"ranks_per_node={per_node} but nodes {short} have fewer slots")
    ranks = tuple(
        RankSlot(
            rank=i * per_node + local,
            node_name=node.name,
            local_rank=local,
            device=local if gpu_devices else -1,
        )
        for i, node in enumerate(nodes)
        for local in range(per_node)
    )
    return BenchmarkSpec(
        job_id=job_id,
        collective=collective,
        sweep=sweep,
        dtype=dtype,
        warmup_iters=warmup_iters,
        iters=iters,
        placements=placements,
        check=check,
        env=dict(env),
        world_size=len(ranks),
        ranks=ranks,
        tuner_table=tuner_table,
        cuda_graph=cuda_graph,
        rendezvous_host=nodes[0].address,
        rendezvous_port=rendezvous_port,
    )


def missing_ranks(spec: BenchmarkSpec, results: Iterable[RankResult]) -> tuple[int, ...]:
    """Ranks of the job with no result."""
    have = {r.rank for r in results}
    return tuple(r for r in range(spec.world_size) if r not in have)


def aggregate(spec: BenchmarkSpec, results: Iterable[RankResult]) -> tuple[SizeMeasurement, ...]:
    """One measurement per (spec, size, placement) over all ranks: the slowest rank's time."""
    results = list(results)
    missing = missing_ranks(spec, results)
    if missing:
        raise ValueError(f"job {spec.job_id}: no result from ranks {list(missing)}")
    specs = spec.specs()
    grouped: dict[tuple[int, int, bool], list[SizeMeasurement]] = {}
    for result in results:
        for m in result.sizes:
            if m.spec >= len(specs):
                raise ValueError(f"job {spec.job_id}: rank {result.rank} reports spec {m.spec} of {len(specs)}")
            grouped.setdefault((m.spec, m.bytes, m.in_place), []).append(m)
    out = []
    for (index, size, in_place), rows in sorted(grouped.items()):
        one = specs[index]
        if len(rows) != spec.world_size:
            where = f"spec {index} " if len(specs) > 1 else ""
            raise ValueError(
                f"job {spec.job_id}: {where}size {size} in_place={in_place} has {len(rows)} of {spec.world_size} ranks"
            )
        slowest = max(rows, key=lambda m: m.time_us)
        shp = shape(
            one.collective,
            size_bytes=_requested_size(one, size),
            element_size=one.dtype.size,
            nranks=one.world_size,
        )
        algbw, busbw = bandwidth(one.collective, shape=shp, seconds=slowest.time_us / 1e6, nranks=one.world_size)
        out.append(
            SizeMeasurement(
                bytes=size,
                count=slowest.count,
                in_place=in_place,
                time_us=slowest.time_us,
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                wrong=sum(m.wrong for m in rows),
                checked=all(m.checked for m in rows),
                p50_us=max(m.p50_us for m in rows),
                p99_us=max(m.p99_us for m in rows),
                cv=max(m.cv for m in rows),
                # Every rank of a communicator makes the same choice (or the job hangs): the first one that knows.
                choice=next((m.choice for m in rows if m.choice is not None), None),
                spec=index,
            )
        )
    return tuple(out)


def _requested_size(spec: BenchmarkSpec, reported_bytes: int) -> int:
    """The sweep size whose nccl-tests shape reports ``reported_bytes``."""
    for size in spec.sweep.sizes():
        shp = shape(spec.collective, size_bytes=size, element_size=spec.dtype.size, nranks=spec.world_size)
        if shp.reported_bytes == reported_bytes:
            return size
    raise ValueError(f"job {spec.job_id}: size {reported_bytes} is not in the job's sweep")


def probe_rounds(nodes: Sequence[str]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Rounds of disjoint node pairs covering every pair exactly once (circle method)."""
    if len(set(nodes)) != len(nodes):
        raise ValueError("nodes lists a node twice")
    ring: list[str | None] = list(nodes)
    if len(ring) < 2:
        return ()
    if len(ring) % 2:
        ring.append(None)  # a bye: whoever meets it rests this round
    n = len(ring)
    rounds = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = ring[i], ring[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b))
        rounds.append(tuple(pairs))
        # Keep the first seat fixed and rotate the rest by one.
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return tuple(rounds)


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job's outcome over all its nodes' command results."""

    status: JobStatus
    message: str
    rows: tuple[SizeMeasurement, ...]
    """Aggregated measurements (empty unless every rank reported)."""
    missing_ranks: tuple[int, ...]
    """Ranks that never reached the rendezvous, or whose node sent no result."""
    hung_ranks: tuple[int, ...]
    wrong: int


def summarize(spec: BenchmarkSpec, results: Mapping[str, agent_pb2.CommandResult]) -> JobSummary:
    """Fold every node's ``CommandResult`` of one job into its outcome.

    ``results`` maps node name to that node's result, for the nodes that answered by the job's
    deadline; a node that did not answer has all its ranks counted missing.
    """
    ranks_by_node: dict[str, list[int]] = {}
    for slot in spec.ranks:
        ranks_by_node.setdefault(slot.node_name, []).append(slot.rank)
    missing: set[int] = set()
    hung: set[int] = set()
    failures: list[str] = []
    rank_results: list[RankResult] = []
    for node, ranks in sorted(ranks_by_node.items()):
        result = results.get(node)
        if result is None:
            missing.update(ranks)
            failures.append(f"{node}: no result")
            continue
        statuses = result.node_benchmark.rank_status
        hung.update(s.rank for s in statuses if s.outcome == agent_pb2.RANK_OUTCOME_HUNG)
        missing.update(r for s in statuses for r in s.waiting_for)
        missing.update(s.rank for s in statuses if s.phase in ("started", "not_started"))
        rank_results.extend(rank_result_from_proto(r) for r in result.node_benchmark.ranks)
        if result.status != agent_pb2.COMMAND_STATUS_SUCCEEDED:
            failures.append(f"{node}: {result.message}")
    wrong = sum(r.wrong for r in rank_results)
    rows = aggregate(spec, rank_results) if not missing_ranks(spec, rank_results) else ()
    silent = [n for n in ranks_by_node if n not in results]
    if hung or silent:
        status = JobStatus.TIMED_OUT
    elif failures or wrong or not rows:
        status = JobStatus.FAILED
    else:
        status = JobStatus.SUCCEEDED
    detail = "; ".join(failures) if failures else f"{spec.world_size} ranks finished"
    return JobSummary(
        status=status,
        message=f"job {spec.job_id} {status.value}: {detail}",
        rows=rows,
        missing_ranks=tuple(sorted(missing)),
        hung_ranks=tuple(sorted(hung)),
        wrong=wrong,
    )


def fitting(spec: BenchmarkSpec, node: str, stored: bytes) -> agent_pb2.CommandResult:
    """A node's stored result, or a failed one naming what in it does not fit the job.

    An agent of another version (or a misbehaving one) may report ranks or sizes the job does not have, or
    times no run takes; folded in as they are, they would fail the summary on every attempt and leave the job
    running for good, or become the job's figures.
    """
    result = agent_pb2.CommandResult.FromString(stored)
    specs = spec.specs()
    asked = [
        {
            shape(s.collective, size_bytes=size, element_size=s.dtype.size, nranks=s.world_size).reported_bytes
            for size in s.sweep.sizes()
        }
        for s in specs
    ]
    seen: set[tuple[int, int]] = set()
    why = ""
    for rank in result.node_benchmark.ranks:
        # A rank of a job of several specs reports once per spec: its rank in that spec's rank map.
        index = rank.sizes[0].spec if rank.sizes else 0
        own = {slot.rank for slot in specs[index].ranks if slot.node_name == node} if index < len(specs) else set()
        stray = sorted({m.bytes for m in rank.sizes} - asked[index]) if index < len(specs) else []
        # A time no run takes would become the job's figure (a NaN wins max() when it comes first).
        untimed = [(m.bytes, m.time_us) for m in rank.sizes if not (math.isfinite(m.time_us) and m.time_us > 0)]
        if index >= len(specs) or any(m.spec != index for m in rank.sizes):
            why = f"rank {rank.rank} reports rows of specs the job does not have or of several specs at once"
        elif rank.rank not in own:
            why = f"rank {rank.rank} is not one of its ranks {sorted(own)}"
        elif (index, rank.rank) in seen:
            why = f"rank {rank.rank} is reported twice"
        elif stray:
            why = f"rank {rank.rank} reports sizes {stray} the job did not ask for"
        elif untimed:
            why = f"rank {rank.rank} reports a time of {untimed[0][1]} us at {untimed[0][0]} bytes"
        if why:
            return agent_pb2.CommandResult(
                status=agent_pb2.COMMAND_STATUS_FAILED, message=f"its results do not fit the job: {why}"
            )
        seen.add((index, rank.rank))
    return result
