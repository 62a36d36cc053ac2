"""What a benchmark measured: per size and placement on one rank, and how each rank ended.

Plain frozen dataclasses with a JSON form (workers write it, the agent reads it); the protobuf
form lives in ``wire``.

Non-goals: aggregation over ranks (``topo_tune.controller.benchmarks.plan``), rendering
(``table``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["NcclChoice", "RankOutcome", "RankResult", "RankStatus", "SizeMeasurement"]


@dataclass(frozen=True, slots=True)
class NcclChoice:
    """NCCL's algorithm/protocol choice at one size (the tuner plugin's record, or the sim's model).

    Entries are ``algorithm/protocol`` in the tuner table's names (``ring/ll128``).
    """

    offered: tuple[str, ...]
    """The entries NCCL's cost table allowed (cost not -1): the only ones a tuner row may name."""
    nccl: str
    """NCCL's own pick."""
    applied: str
    """What ran: a tuner row's entry where one applied, else NCCL's."""
    channels: int = 0
    """The channel count a tuner row set; 0: NCCL's own."""

    def to_json(self) -> dict[str, Any]:
        return {"offered": list(self.offered), "nccl": self.nccl, "applied": self.applied, "channels": self.channels}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NcclChoice:
        return cls(tuple(data["offered"]), data["nccl"], data["applied"], int(data["channels"]))


@dataclass(frozen=True, slots=True)
class SizeMeasurement:
    """One row half of an nccl-tests table: a size run out-of-place or in-place."""

    bytes: int
    count: int
    in_place: bool
    time_us: float
    """Mean time per iteration over the timed loop (nccl-tests' ``time``)."""
    algbw_gbps: float
    busbw_gbps: float
    wrong: int
    """Elements that differed from the expected result in the data check."""
    checked: bool
    """False when no data check covered this row (check off); rendered ``N/A`` like nccl-tests."""
    p50_us: float
    p99_us: float
    cv: float
    choice: NcclChoice | None = None
    """What NCCL offered and ran at this size, where the backend knows it."""
    spec: int = 0
    """Which of its job's specs measured it (``BenchmarkSpec.specs``): 0 in a job of one spec."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["choice"] = self.choice.to_json() if self.choice is not None else None
        if not self.spec:
            del data["spec"]  # a job of one spec stores its rows as before
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SizeMeasurement:
        choice = data.get("choice")
        return cls(**{**data, "choice": NcclChoice.from_json(choice) if choice else None})


@dataclass(frozen=True, slots=True)
class RankResult:
    job_id: str
    rank: int
    sizes: tuple[SizeMeasurement, ...]
    effective_env: Mapping[str, str] = field(default_factory=dict)
    simulated: bool = False

    @property
    def wrong(self) -> int:
        return sum(s.wrong for s in self.sizes)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "rank": self.rank,
            "sizes": [s.to_json() for s in self.sizes],
            "effective_env": dict(self.effective_env),
            "simulated": self.simulated,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankResult:
        return cls(
            job_id=data["job_id"],
            rank=data["rank"],
            sizes=tuple(SizeMeasurement.from_json(s) for s in data["sizes"]),
            effective_env=dict(data["effective_env"]),
            simulated=data.get("simulated", False),
        )


class RankOutcome(enum.StrEnum):
    FINISHED = "finished"
    FAILED = "failed"
    """The worker exited with an error (its message says why)."""
    HUNG = "hung"
    """Still running at the deadline; killed with its whole process group."""
    NOT_STARTED = "not_started"


@dataclass(frozen=True, slots=True)
class RankStatus:
    """How one local rank ended, with the last phase it reported."""

    rank: int
    outcome: RankOutcome
    phase: str
    """Last phase reached: started, rendezvous, joined, running, finished."""
    joined: bool
    """Whether the rank got through the rendezvous."""
    exit_code: int | None = None
    message: str = ""
    waiting_for: tuple[int, ...] = ()
    """Ranks this rank was still waiting for at the rendezvous, when it knew."""
