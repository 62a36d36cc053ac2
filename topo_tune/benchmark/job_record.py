"""A benchmark job as the controller reports it, and the request that starts one: plain frozen values.

The controller's benchmark service takes ``BenchmarkRequest`` and returns ``BenchmarkJob``; the admin API's
messages are converted at the edges (the controller's ``api/messages.py``, the admin client). A job's
aggregated rows are ``SizeMeasurement``s, stored as their JSON form. Non-goals: planning (``job_spec``,
``controller/benchmarks/plan.py``), the wire.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from topo_tune.benchmark.results import SizeMeasurement
from topo_tune.ids import JobId
from topo_tune.nccl.collectives import Collective

__all__ = ["BenchmarkJob", "BenchmarkRequest", "JobOutcome", "JobStatus", "NextSpecRequest", "SizeRange"]


class JobStatus(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """A rank failed, or the data check found wrong elements."""
    TIMED_OUT = "timed_out"

    @property
    def final(self) -> bool:
        return self is not JobStatus.RUNNING


@dataclass(frozen=True, slots=True)
class SizeRange:
    """The sizes asked for, as given (0: the default); ``SizeSweep`` checks them when the job is planned."""

    min_bytes: int = 0
    max_bytes: int = 0
    step_factor: int = 0


@dataclass(frozen=True)
class NextSpecRequest:
    """A further spec of a requested job, run after the ones before it: what it may change of the job."""

    collective: Collective | None
    nodes: tuple[str, ...]
    """The job's nodes, in this spec's rank order."""
    sizes: SizeRange = SizeRange()
    env: Mapping[str, str] = field(default_factory=dict)
    tuner_table: str = ""
    sim_seed: int | None = None


@dataclass(frozen=True)
class BenchmarkRequest:
    """What a caller asks for; zero values mean the controller's defaults."""

    collective: Collective | None
    """None: the caller named none (refused, naming the field)."""
    nodes: tuple[str, ...]
    """Rank order: ranks are contiguous per node, node by node."""
    sizes: SizeRange = SizeRange()
    dtype: str = ""
    warmup_iters: int = 0
    iters: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    ranks_per_node: int = 0
    deadline_s: int = 0
    both_placements: bool = False
    job_id: str = ""
    tuner_table: str = ""
    cuda_graph: bool = False
    sim_seed: int | None = None
    next_specs: tuple[NextSpecRequest, ...] = ()
    """Further specs of the same job, run after this one in order (a row's ``spec`` says which measured it)."""


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a finished job measured: the slowest rank's rows, and the ranks that did not finish."""

    sizes: tuple[SizeMeasurement, ...] = ()
    missing_ranks: tuple[int, ...] = ()
    hung_ranks: tuple[int, ...] = ()
    simulated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "sizes": [s.to_json() for s in self.sizes],
            "missing_ranks": list(self.missing_ranks),
            "hung_ranks": list(self.hung_ranks),
            "simulated": self.simulated,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobOutcome:
        return cls(
            sizes=tuple(SizeMeasurement.from_json(s) for s in data.get("sizes", [])),
            missing_ranks=tuple(int(r) for r in data.get("missing_ranks", [])),
            hung_ranks=tuple(int(r) for r in data.get("hung_ranks", [])),
            simulated=bool(data.get("simulated", False)),
        )


@dataclass(frozen=True)
class BenchmarkJob:
    """A job across nodes: what it runs, where it stands, and once finished what it measured."""

    job_id: JobId
    status: JobStatus
    message: str
    collective: Collective
    nodes: tuple[str, ...]
    world_size: int
    dtype: str
    env: Mapping[str, str]
    backend: str
    sizes_requested: SizeRange
    iters: int
    warmup_iters: int
    cuda_graph: bool
    tuner_table_sha256: str
    """SHA-256 (hex) of the candidate tuner table the ranks ran; empty: none."""
    created_at: datetime
    simulated: bool
    sizes: tuple[SizeMeasurement, ...] = ()
    """Aggregated: the slowest rank's time per size and placement."""
    missing_ranks: tuple[int, ...] = ()
    hung_ranks: tuple[int, ...] = ()
    finished_at: datetime | None = None
