"""One benchmark job as every backend sees it: what to run, on which ranks, with which env.

``BenchmarkSpec`` is the validated, typed form of the wire message ``RunBenchmark`` (see
``wire`` for the conversion); the agent builds it once at the edge and passes it down. It
serialises to plain JSON so that worker processes need neither gRPC nor protobuf.

Non-goals: the environment policy (``env_policy``), running (``topo_tune.agent.bench``),
planning rank maps (``topo_tune.controller.benchmarks.plan``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from topo_tune.benchmark.dtypes import DType, dtype_named
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.errors import SpecError, TunerTableError
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin.job_env import PLUGIN_ENV, TABLE_ENV
from topo_tune.plugin.table import parse_tuner_table

__all__ = ["MAX_DEADLINE_S", "MAX_ITERS", "MAX_SPECS", "BenchmarkSpec", "RankSlot", "SpecError"]

MAX_ITERS = 10_000
MAX_SPECS = 128
"""The most specs one job may carry (``next_specs`` and the first): a bound on a job's command and result."""
MAX_DEADLINE_S = 24 * 3600
"""The longest deadline a benchmark job or probe may have: the controller refuses more, and so does the agent
(the wire field is a uint32; far beyond this the launcher's wait could not even be expressed)."""
_SHARED = (
    "job_id",
    "dtype",
    "warmup_iters",
    "iters",
    "placements",
    "check",
    "world_size",
    "cuda_graph",
)
"""What every spec of a job shares (what ``NextSpec`` on the wire leaves out)."""
_JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


@dataclass(frozen=True, slots=True)
class RankSlot:
    """One rank of the job placed on a node (``RankPlacement`` on the wire)."""

    rank: int
    node_name: str
    local_rank: int
    device: int
    """GPU index for nccl; -1 on CPU backends."""


@dataclass(frozen=True, slots=True)
class BenchmarkSpec:
    job_id: str
    collective: Collective
    sweep: SizeSweep
    dtype: DType
    warmup_iters: int
    iters: int
    placements: tuple[bool, ...]
    """In-place flags to run for every size, in order (nccl-tests runs (False, True))."""
    check: bool
    env: Mapping[str, str]
    world_size: int
    ranks: tuple[RankSlot, ...]
    rendezvous_host: str
    rendezvous_port: int
    tuner_table: str = ""
    """A candidate table for the tuner plugin (``nccl_tuner.conf``'s columns); empty: none."""
    cuda_graph: bool = False
    """Time each size as one CUDA graph of ``iters`` calls (nccl-tests ``-G``); GPU backends only."""
    next_specs: tuple[BenchmarkSpec, ...] = ()
    """Further specs of the same job, run after this one in order (both arms of an A/B pair, the collectives
    of one setting): each may differ in collective, sweep, env, tuner table and rank order, nothing else."""

    def __post_init__(self) -> None:
        if not _JOB_ID_RE.match(self.job_id):
            raise SpecError(f"job_id {self.job_id!r} must be 1-128 of [A-Za-z0-9._-], starting alphanumeric")
        if not 1 <= self.iters <= MAX_ITERS:
            raise SpecError(f"iters must be 1..{MAX_ITERS}, got {self.iters}")
        if not 0 <= self.warmup_iters <= MAX_ITERS:
            raise SpecError(f"warmup_iters must be 0..{MAX_ITERS}, got {self.warmup_iters}")
        if not self.placements or len(set(self.placements)) != len(self.placements):
            raise SpecError(f"placements must be one or both of out-of-place/in-place, got {self.placements}")
        if self.world_size < 1:
            raise SpecError(f"world_size must be >= 1, got {self.world_size}")
        if len(self.ranks) != self.world_size:
            raise SpecError(f"ranks lists {len(self.ranks)} placements but world_size is {self.world_size}")
        if sorted(r.rank for r in self.ranks) != list(range(self.world_size)):
            raise SpecError(f"ranks must hold each rank 0..{self.world_size - 1} exactly once")
        seen: set[tuple[str, int]] = set()
        for slot in self.ranks:
            if not slot.node_name:
                raise SpecError(f"ranks[{slot.rank}].node_name is empty")
            key = (slot.node_name, slot.local_rank)
            if key in seen:
                raise SpecError(f"ranks: local_rank {slot.local_rank} appears twice on node {slot.node_name!r}")
            seen.add(key)
        if not self.rendezvous_host:
            raise SpecError("rendezvous_host is empty")
        if not 1 <= self.rendezvous_port <= 65535:
            raise SpecError(f"rendezvous_port must be 1..65535, got {self.rendezvous_port}")
        if self.tuner_table:
            try:
                parse_tuner_table(self.tuner_table, source="tuner_table")
            except TunerTableError as exc:
                raise SpecError(f"tuner_table line {exc.line}: {exc.reason}") from None
            # The agent points both variables at its own plugin and its staged copy of the table.
            for variable in (PLUGIN_ENV, TABLE_ENV):
                if variable in self.env:
                    raise SpecError(f"env.{variable} is set by the agent for a job with a tuner_table; leave it out")
        self._check_next_specs()

    def _check_next_specs(self) -> None:
        if len(self.next_specs) >= MAX_SPECS:
            raise SpecError(f"next_specs: at most {MAX_SPECS - 1}, got {len(self.next_specs)}")
        nodes = sorted({s.node_name for s in self.ranks})
        for i, spec in enumerate(self.next_specs):
            if spec.next_specs:
                raise SpecError(f"next_specs[{i}] has next_specs of its own")
            differing = [name for name in _SHARED if getattr(spec, name) != getattr(self, name)]
            if differing:
                raise SpecError(f"next_specs[{i}].{differing[0]} differs from the job's: only what NextSpec holds may")
            if sorted({s.node_name for s in spec.ranks}) != nodes:
                raise SpecError(f"next_specs[{i}].ranks place ranks on other nodes than the job's")

    def specs(self) -> tuple[BenchmarkSpec, ...]:
        """The job's specs in the order they run, each a job of one spec (a row's ``spec`` indexes this)."""
        if not self.next_specs:
            return (self,)
        return (replace(self, next_specs=()), *self.next_specs)

    def local_slots(self, node_name: str) -> tuple[RankSlot, ...]:
        """This node's ranks, by local rank."""
        return tuple(sorted((s for s in self.ranks if s.node_name == node_name), key=lambda s: s.local_rank))

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "collective": self.collective.value,
            "sweep": [self.sweep.min_bytes, self.sweep.max_bytes, self.sweep.step_factor],
            "dtype": self.dtype.name,
            "warmup_iters": self.warmup_iters,
            "iters": self.iters,
            "placements": list(self.placements),
            "check": self.check,
            "env": dict(self.env),
            "world_size": self.world_size,
            "ranks": [[s.rank, s.node_name, s.local_rank, s.device] for s in self.ranks],
            "rendezvous_host": self.rendezvous_host,
            "rendezvous_port": self.rendezvous_port,
            "tuner_table": self.tuner_table,
            "cuda_graph": self.cuda_graph,
            **({"next_specs": [s.to_json() for s in self.next_specs]} if self.next_specs else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchmarkSpec:
        lo, hi, factor = data["sweep"]
        return cls(
            job_id=data["job_id"],
            collective=Collective(data["collective"]),
            sweep=SizeSweep(lo, hi, factor),
            dtype=dtype_named(data["dtype"]),
            warmup_iters=data["warmup_iters"],
            iters=data["iters"],
            placements=tuple(data["placements"]),
            check=data["check"],
            env=dict(data["env"]),
            world_size=data["world_size"],
            ranks=tuple(RankSlot(r, n, lr, d) for r, n, lr, d in data["ranks"]),
            rendezvous_host=data["rendezvous_host"],
            rendezvous_port=data["rendezvous_port"],
            tuner_table=data.get("tuner_table", ""),
            cuda_graph=data.get("cuda_graph", False),
            next_specs=tuple(BenchmarkSpec.from_json(s) for s in data.get("next_specs", [])),
        )
