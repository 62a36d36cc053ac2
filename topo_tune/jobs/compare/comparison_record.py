"""A job's own A/B as the controller keeps it and the admin client reads it back: one domain type for both.

``ComparisonHeader`` is what every node of the job says alike; a node records it with the runs it read, and the
controller answers with the ``StoredComparison`` as it stands (its figures once every run is in). The admin API's
messages are built from these and read back into them in ``wire/job_comparisons.py``. Non-goals: checking or
storing a record (``controller/job_comparisons.py``), the statistics (``summary``), the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from topo_tune.jobs.compare.schedule import Arm
from topo_tune.jobs.compare.summary import ComparisonSummary, RunValue


@dataclass(frozen=True)
class ComparisonHeader:
    """What every node of the job says alike about its comparison."""

    job_id: str
    candidate: str
    """The ``--compare`` arm as named: a version id or ``stable``."""
    candidate_version: str
    """What it resolved to; "" for NCCL's defaults."""
    against: str
    """stable, defaults or a version id."""
    against_version: str
    metric: str
    """The ``--metric`` regular expression."""
    higher_is_better: bool
    pairs: int
    nodes: tuple[str, ...]
    candidate_order: tuple[str, ...]
    """The job's node order under each arm (node rank = position)."""
    against_order: tuple[str, ...]

    def order(self, arm: Arm) -> tuple[str, ...]:
        return self.candidate_order if arm is Arm.CANDIDATE else self.against_order

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ComparisonHeader:
        lists = {name: tuple(data[name]) for name in ("nodes", "candidate_order", "against_order")}
        return cls(**{**data, **lists})


@dataclass(frozen=True)
class StoredComparison:
    id: str
    header: ComparisonHeader
    runs: tuple[RunValue, ...]
    """Every run recorded so far, in schedule order."""
    figures: ComparisonSummary | None
    """None until every run is in."""
    created_at: datetime
    completed_at: datetime | None

    @property
    def complete(self) -> bool:
        return self.figures is not None
