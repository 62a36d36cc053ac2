"""Per-iteration time statistics, defined as nccl-tests' ``-I 1`` report defines them.

``computeIterStats`` in nccl-tests ``src/util.cu``: sort the samples; p50 is ``sorted[n // 2]``;
p99 is the nearest-rank ``sorted[min(n - 1, ceil(n * 99 / 100) - 1)]``; the standard deviation
is the population one; CV = stdev / mean (a fraction here, nccl-tests prints it in %).

Non-goals: deciding whether two configurations differ (the tuner's statistics do that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["IterationStats"]


def _percentile_index(n: int, percentile: int) -> int:
    return min(n - 1, (n * percentile + 99) // 100 - 1)


@dataclass(frozen=True, slots=True)
class IterationStats:
    """Summary of one size's per-iteration times, in microseconds."""

    mean_us: float
    min_us: float
    max_us: float
    p50_us: float
    p99_us: float
    cv: float

    @classmethod
    def from_samples(cls, samples_us: Sequence[float]) -> IterationStats:
        if not samples_us:
            raise ValueError("at least one iteration time is needed")
        ordered = sorted(samples_us)
        n = len(ordered)
        mean = math.fsum(ordered) / n
        variance = math.fsum((x - mean) ** 2 for x in ordered) / n
        cv = math.sqrt(variance) / mean if mean > 0 else 0.0
        return cls(
            mean_us=mean,
            min_us=ordered[0],
            max_us=ordered[-1],
            p50_us=ordered[n // 2],
            p99_us=ordered[_percentile_index(n, 99)],
            cv=cv,
        )
