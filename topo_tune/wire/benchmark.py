"""Conversions between the benchmark domain types and the ``topo_tune.v1`` wire messages.

The only place that knows both; everything else works on ``BenchmarkSpec``, ``RankResult`` and
``RankStatus``. Bad wire input raises ``SpecError``/``SweepError`` naming the field.

Non-goals: gRPC (no ``grpc`` import; these are plain protobuf messages).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.job_spec import MAX_SPECS, BenchmarkSpec, RankSlot
from topo_tune.benchmark.results import NcclChoice, RankOutcome, RankResult, RankStatus, SizeMeasurement
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.errors import SpecError
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2

__all__ = [
    "COLLECTIVE_FROM_PROTO",
    "COLLECTIVE_TO_PROTO",
    "choice_from_proto",
    "choice_to_proto",
    "collective_from_proto",
    "node_result_to_proto",
    "rank_result_from_proto",
    "rank_result_to_proto",
    "rank_status_to_proto",
    "size_from_proto",
    "size_to_proto",
    "spec_from_proto",
    "spec_to_proto",
]

COLLECTIVE_TO_PROTO: dict[Collective, agent_pb2.Collective.ValueType] = {
    Collective.ALL_REDUCE: agent_pb2.COLLECTIVE_ALL_REDUCE,
    Collective.ALL_GATHER: agent_pb2.COLLECTIVE_ALL_GATHER,
    Collective.REDUCE_SCATTER: agent_pb2.COLLECTIVE_REDUCE_SCATTER,
    Collective.BROADCAST: agent_pb2.COLLECTIVE_BROADCAST,
    Collective.REDUCE: agent_pb2.COLLECTIVE_REDUCE,
    Collective.ALLTOALL: agent_pb2.COLLECTIVE_ALLTOALL,
    Collective.SENDRECV: agent_pb2.COLLECTIVE_SENDRECV,
}
COLLECTIVE_FROM_PROTO = {v: k for k, v in COLLECTIVE_TO_PROTO.items()}
if set(COLLECTIVE_TO_PROTO) != set(Collective) or set(COLLECTIVE_FROM_PROTO) != set(agent_pb2.Collective.values()) - {
    agent_pb2.COLLECTIVE_UNSPECIFIED
}:  # pragma: no cover - an import-time check that both mappings are total
    raise RuntimeError("every Collective needs its wire value, and every wire value its Collective")


def collective_from_proto(value: int, *, field: str = "collective") -> Collective:
    """The collective a message names; ``SpecError`` naming the field for an unset or unknown value."""
    collective = COLLECTIVE_FROM_PROTO.get(agent_pb2.Collective.ValueType(value))
    if collective is None:
        known = ", ".join(c.value for c in Collective)
        raise SpecError(f"{field}: {value} is not a collective this topo-tune knows ({known})")
    return collective


_OUTCOME_TO_PROTO = {
    RankOutcome.FINISHED: agent_pb2.RANK_OUTCOME_FINISHED,
    RankOutcome.FAILED: agent_pb2.RANK_OUTCOME_FAILED,
    RankOutcome.HUNG: agent_pb2.RANK_OUTCOME_HUNG,
    RankOutcome.NOT_STARTED: agent_pb2.RANK_OUTCOME_NOT_STARTED,
}


def spec_from_proto(run: agent_pb2.RunBenchmark) -> BenchmarkSpec:
    """Validate a ``RunBenchmark``; raises ``ValueError`` subclasses naming the field."""
    collective = collective_from_proto(run.collective)
    try:
        dtype = dtype_named(run.dtype or "float32")
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    placements = (False, True) if run.both_placements else (run.in_place,)
    first = BenchmarkSpec(
        job_id=run.job_id,
        collective=collective,
        sweep=SizeSweep(run.sizes.min_bytes, run.sizes.max_bytes, run.sizes.step_factor),
        dtype=dtype,
        warmup_iters=run.warmup_iters,
        iters=run.iters,
        placements=placements,
        check=run.check,
        env=dict(run.env),
        world_size=run.world_size,
        ranks=_ranks(run.ranks),
        rendezvous_host=run.rendezvous_host,
        rendezvous_port=run.rendezvous_port,
        tuner_table=run.tuner_table,
        cuda_graph=run.cuda_graph,
    )
    if not run.next_specs:
        return first
    if len(run.next_specs) >= MAX_SPECS:  # before building any: a bound on the work a command can ask for
        raise SpecError(f"next_specs: at most {MAX_SPECS - 1}, got {len(run.next_specs)}")
    more = tuple(
        dataclasses.replace(
            first,
            collective=collective_from_proto(n.collective, field=f"next_specs[{i}].collective"),
            sweep=SizeSweep(n.sizes.min_bytes, n.sizes.max_bytes, n.sizes.step_factor),
            env=dict(n.env),
            tuner_table=n.tuner_table,
            ranks=_ranks(n.ranks),
            rendezvous_host=n.rendezvous_host,
            rendezvous_port=n.rendezvous_port,
        )
        for i, n in enumerate(run.next_specs)
    )
    return dataclasses.replace(first, next_specs=more)


def _ranks(placements: Iterable[agent_pb2.RankPlacement]) -> tuple[RankSlot, ...]:
    return tuple(RankSlot(p.rank, p.node_name, p.local_rank, p.device) for p in placements)


def _placements(slots: Iterable[RankSlot]) -> list[agent_pb2.RankPlacement]:
    return [
        agent_pb2.RankPlacement(rank=s.rank, node_name=s.node_name, local_rank=s.local_rank, device=s.device)
        for s in slots
    ]


def _sweep(sweep: SizeSweep) -> agent_pb2.SizeSweep:
    return agent_pb2.SizeSweep(min_bytes=sweep.min_bytes, max_bytes=sweep.max_bytes, step_factor=sweep.step_factor)


def spec_to_proto(spec: BenchmarkSpec) -> agent_pb2.RunBenchmark:
    """The job's ``RunBenchmark``: its first spec in the message's own fields, the others in ``next_specs``
    (their ``sim_seed`` is the controller's to set)."""
    both = spec.placements == (False, True)
    return agent_pb2.RunBenchmark(
        job_id=spec.job_id,
        collective=COLLECTIVE_TO_PROTO[spec.collective],
        sizes=_sweep(spec.sweep),
        dtype=spec.dtype.name,
        warmup_iters=spec.warmup_iters,
        iters=spec.iters,
        in_place=False if both else spec.placements[0],
        both_placements=both,
        check=spec.check,
        env=dict(spec.env),
        world_size=spec.world_size,
        ranks=_placements(spec.ranks),
        rendezvous_host=spec.rendezvous_host,
        rendezvous_port=spec.rendezvous_port,
        tuner_table=spec.tuner_table,
        cuda_graph=spec.cuda_graph,
        next_specs=[
            agent_pb2.NextSpec(
                collective=COLLECTIVE_TO_PROTO[n.collective],
                sizes=_sweep(n.sweep),
                env=dict(n.env),
                tuner_table=n.tuner_table,
                ranks=_placements(n.ranks),
                rendezvous_host=n.rendezvous_host,
                rendezvous_port=n.rendezvous_port,
            )
            for n in spec.next_specs
        ],
    )


_SIZE_FIELDS = tuple(f.name for f in dataclasses.fields(SizeMeasurement))


def size_to_proto(m: SizeMeasurement) -> agent_pb2.SizeResult:
    msg = agent_pb2.SizeResult(**{name: getattr(m, name) for name in _SIZE_FIELDS if name != "choice"})
    if m.choice is not None:
        msg.choice.CopyFrom(choice_to_proto(m.choice))
    return msg


def size_from_proto(s: agent_pb2.SizeResult) -> SizeMeasurement:
    values = {name: getattr(s, name) for name in _SIZE_FIELDS if name != "choice"}
    return SizeMeasurement(**values, choice=choice_from_proto(s.choice) if s.HasField("choice") else None)


def choice_to_proto(choice: NcclChoice) -> agent_pb2.NcclChoice:
    return agent_pb2.NcclChoice(
        offered=list(choice.offered), nccl=choice.nccl, applied=choice.applied, channels=choice.channels
    )


def choice_from_proto(msg: agent_pb2.NcclChoice) -> NcclChoice:
    return NcclChoice(tuple(msg.offered), msg.nccl, msg.applied, msg.channels)


def rank_result_to_proto(result: RankResult) -> agent_pb2.BenchmarkResult:
    return agent_pb2.BenchmarkResult(
        job_id=result.job_id,
        rank=result.rank,
        sizes=[size_to_proto(m) for m in result.sizes],
        effective_env=dict(result.effective_env),
        simulated=result.simulated,
    )


def rank_result_from_proto(msg: agent_pb2.BenchmarkResult) -> RankResult:
    return RankResult(
        job_id=msg.job_id,
        rank=msg.rank,
        sizes=tuple(size_from_proto(s) for s in msg.sizes),
        effective_env=dict(msg.effective_env),
        simulated=msg.simulated,
    )


def rank_status_to_proto(status: RankStatus) -> agent_pb2.RankStatus:
    return agent_pb2.RankStatus(
        rank=status.rank,
        outcome=_OUTCOME_TO_PROTO[status.outcome],
        phase=status.phase,
        joined=status.joined,
        exit_code=status.exit_code if status.exit_code is not None else 0,
        message=status.message,
        waiting_for=list(status.waiting_for),
    )


def node_result_to_proto(
    *, job_id: str, node_name: str, results: Iterable[RankResult], statuses: Iterable[RankStatus]
) -> agent_pb2.NodeBenchmarkResult:
    results = list(results)
    return agent_pb2.NodeBenchmarkResult(
        job_id=job_id,
        node_name=node_name,
        ranks=[rank_result_to_proto(r) for r in results],
        rank_status=[rank_status_to_proto(s) for s in statuses],
        simulated=any(r.simulated for r in results),
    )
