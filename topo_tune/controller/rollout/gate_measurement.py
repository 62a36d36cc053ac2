"""What a wave's gate measures: the verification benchmark's sizes, iterations, timing and A/B repeats.

Chosen per rollout (``admin rollout create --gate-*``), defaulting to cluster.yaml's ``rollout.gate``, and
stored with the rollout, so a resumed controller measures every wave of it the same way. The defaults suit
GPU fabrics (1 MiB to 256 MiB all_reduce); a slow or noisy fabric wants a single large-enough size and more
repeats, so that a repeat's time is dominated by the link, not by the workers' start-up. On nccl nodes,
``cuda_graph`` times each size as CUDA graphs (nccl-tests ``-G``), which takes the CPU's 25-45 us per eager call
out of small sizes; drift checks measure as the stable rollout's gates did, so they inherit it.

Non-goals: running the jobs (``verification.py``) and judging them (``gates.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from topo_tune.errors import ValidationError

MAX_REPEATS = 1000
MAX_ITERS = 10_000


@dataclass(frozen=True)
class GateMeasurement:
    repeats: int = 8
    """A/B repeats: each runs one job per version, so a gate runs ``2 × repeats`` jobs."""
    min_bytes: int = 1 << 20
    max_bytes: int = 1 << 28
    step_factor: int = 4
    iters: int = 20
    warmup_iters: int = 5
    cuda_graph: bool = False
    """Time each size as CUDA graphs (nccl nodes only: the controller refuses the jobs on others)."""

    def __post_init__(self) -> None:
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise ValidationError("gate.repeats", f"must be 1..{MAX_REPEATS}")
        if not 1 <= self.min_bytes <= self.max_bytes:
            raise ValidationError("gate.min_bytes", "must be at least 1 and at most gate.max_bytes")
        if self.max_bytes > 1 << 40:
            raise ValidationError("gate.max_bytes", "at most 1 TiB")
        if not 2 <= self.step_factor <= 1024:
            raise ValidationError("gate.step_factor", "must be 2..1024")
        if not 1 <= self.iters <= MAX_ITERS:
            raise ValidationError("gate.iters", f"must be 1..{MAX_ITERS}")
        if not 1 <= self.warmup_iters <= MAX_ITERS:
            raise ValidationError("gate.warmup_iters", f"must be 1..{MAX_ITERS}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> GateMeasurement:
        """From stored JSON (an older rollout without these keys gets the defaults)."""
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValidationError(f"gate.{sorted(unknown)[0]}", "unknown gate setting")
        numbers = {k: int(v) for k, v in values.items() if k != "cuda_graph"}
        cuda_graph = values.get("cuda_graph", False)
        if not isinstance(cuda_graph, bool):
            raise ValidationError("gate.cuda_graph", "must be true or false")
        return cls(**numbers, cuda_graph=cuda_graph)

    def overridden(self, values: Mapping[str, int | bool | None]) -> GateMeasurement:
        """These settings with ``values`` in place: a number where it is non-zero (0: keep this one), a flag where
        it is not None (None: keep this one)."""
        given = {k: v for k, v in values.items() if v is not None and (isinstance(v, bool) or v != 0)}
        return GateMeasurement.from_mapping({**asdict(self), **given})
