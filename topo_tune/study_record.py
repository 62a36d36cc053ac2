"""A controller-run study in domain terms: the request that starts one, where it stands, its trials.

The controller's ``studies.py`` takes and returns these, and the admin client hands them to the CLI; the admin
API's messages are built from them and read back into them in ``wire/studies.py``.
A study's request is stored with it as ``StudyRequest.to_json()`` (starting the same id again with other
settings is refused). Non-goals: running a study, the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from topo_tune.ids import StudyId


class StudyStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    """Finished: a config was promoted, or "keep NCCL's defaults"."""
    FAILED = "failed"
    CANCELLED = "cancelled"
    """Stopped by ``admin study cancel`` or a controller restart; starting it again resumes."""


@dataclass(frozen=True)
class StudyRequest:
    """What ``admin study start`` asks for; zero values mean cluster.yaml's defaults."""

    study_id: str = ""
    nodes: tuple[str, ...] = ()
    collectives: Mapping[str, float] = field(default_factory=dict)
    budget: int = 0
    sampler: str = ""
    seed: int = 0
    min_bytes: int = 0
    max_bytes: int = 0
    step_factor: int = 0
    site_fixed: Mapping[str, str] = field(default_factory=dict)
    knobs: tuple[str, ...] = ()
    finalists: int = 0
    proof_pairs: int = 0
    cuda_graph: bool | None = None
    """None: cluster.yaml's default (graphs on nccl nodes)."""
    no_tuner_table: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "study_id": self.study_id,
            "nodes": list(self.nodes),
            "collectives": dict(self.collectives),
            "budget": self.budget,
            "sampler": self.sampler,
            "seed": self.seed,
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "step_factor": self.step_factor,
            "site_fixed": dict(self.site_fixed),
            "knobs": list(self.knobs),
            "finalists": self.finalists,
            "proof_pairs": self.proof_pairs,
            "cuda_graph": self.cuda_graph,
            "no_tuner_table": self.no_tuner_table,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StudyRequest:
        return cls(
            **{
                **data,
                "nodes": tuple(data["nodes"]),
                "knobs": tuple(data["knobs"]),
                "collectives": {k: float(v) for k, v in data["collectives"].items()},
            }
        )


@dataclass(frozen=True)
class Study:
    study_id: StudyId
    status: StudyStatus
    message: str
    nodes: tuple[str, ...]
    simulated: bool
    created_at: datetime
    finished_at: datetime | None = None
    config_version: str = ""
    """The result's version (empty until done)."""
    result: str = ""
    """"promoted" or "keep NCCL's defaults"."""
    phase: str = ""
    done: int = 0
    total: int = 0
    best_value: float | None = None
    """Weighted geometric-mean speedup over the defaults, while the study runs in this controller."""


@dataclass(frozen=True)
class StudyTrial:
    number: int
    state: str
    """complete, pruned, running, waiting, or why it failed (failed, wrong_result, timeout, stale)."""
    reason: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    value: float | None = None


@dataclass(frozen=True)
class StudyTrials:
    study_id: StudyId
    trials: tuple[StudyTrial, ...] = ()
    best_trial: int | None = None
