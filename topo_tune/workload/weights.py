"""Bucket weights that mean time: each (collective, size bucket)'s share of the job's collective time.

A bucket's time is the sum over the job's calls that fall in it of what one call of that size takes, from the
best source at hand, one source for the whole import (so that the shares add up in one unit):

1. ``baseline``: the study's measured baseline (NCCL's defaults on this cluster) at that collective,
   interpolated log-log between the ladder's sizes (below the ladder: its smallest size's time; above it:
   time grows with bytes) — the time the job would spend if it ran on the cluster as measured;
2. ``trace-durations``: the durations the imported files recorded for the calls themselves, when every
   counted call has one (a gloo annotation, a profiled NCCL kernel, an Inspector record);
3. ``bytes``: else the bytes moved, a stand-in that over-weighs large sizes and under-weighs latency-bound
   ones, and is labelled so.

The weights are the shares, normalised to sum to 1; a bucket the job never calls weighs 0, so the tuner
spends neither trials nor proof pairs on it. Calls larger than the largest bucket are listed apart.

Non-goals: reading files (``calls``' readers) and writing ``cluster.yaml`` (``workload_block``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from topo_tune.nccl.collectives import Collective
from topo_tune.tuner.objective import DEFAULT_BUCKETS, Measurements, SizeBucket
from topo_tune.workload.calls import JobCalls

__all__ = ["BucketLoad", "WeightSource", "WorkloadWeights", "weigh"]

WeightSource = Literal["baseline", "trace-durations", "bytes"]

SOURCE_LABELS: Mapping[WeightSource, str] = {
    "baseline": "the study's measured baseline times",
    "trace-durations": "the durations the files recorded",
    "bytes": "bytes moved (no times were available)",
}


@dataclass(frozen=True)
class BucketLoad:
    """One (collective, bucket): the job's calls in it per rank, their bytes, time and weight."""

    collective: Collective
    bucket: SizeBucket
    calls: float
    bytes: float
    time_us: float | None
    weight: float


@dataclass(frozen=True)
class WorkloadWeights:
    """The weights of one import, with where they came from."""

    loads: tuple[BucketLoad, ...]
    source: WeightSource
    job: JobCalls
    total_time_us: float | None
    """The job's collective time per rank over what was recorded (None when weighed by bytes)."""
    oversized: Mapping[Collective, float]
    """Calls per rank above the largest bucket (not weighed)."""

    @property
    def collectives(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for load in self.loads:
            out[load.collective.value] = out.get(load.collective.value, 0.0) + load.weight
        return out

    @property
    def matrix(self) -> dict[str, dict[str, float]]:
        """collective → bucket name → weight, every bucket of every collective the job calls."""
        out: dict[str, dict[str, float]] = {}
        for load in self.loads:
            out.setdefault(load.collective.value, {})[load.bucket.name] = load.weight
        return out


def weigh(
    job: JobCalls, *, buckets: Sequence[SizeBucket] = DEFAULT_BUCKETS, baseline: Measurements | None = None
) -> WorkloadWeights:
    """The weights of ``job``'s calls over ``buckets`` (see the module docstring for the sources)."""
    collectives = sorted({c for c, _ in job.calls})
    source: WeightSource
    if baseline is not None and all(_samples(baseline, c) for c in collectives):
        source = "baseline"
    elif job.timed:
        source = "trace-durations"
    else:
        source = "bytes"
    per: dict[tuple[Collective, str], list[float]] = {}
    oversized: dict[Collective, float] = {}
    for (collective, size), stats in job.calls.items():
        bucket = next((b for b in buckets if b.holds(size)), None)
        if bucket is None:
            oversized[collective] = oversized.get(collective, 0.0) + stats.calls
            continue
        if source == "baseline":
            assert baseline is not None
            cost = stats.calls * _baseline_time(_samples(baseline, collective), size)
        elif source == "trace-durations":
            cost = stats.time_us
        else:
            cost = stats.calls * size
        row = per.setdefault((collective, bucket.name), [0.0, 0.0, 0.0])
        row[0] += stats.calls
        row[1] += stats.calls * size
        row[2] += cost
    total = sum(r[2] for r in per.values())
    loads = []
    for collective in collectives:
        if not any((collective, b.name) in per for b in buckets):
            continue
        for bucket in buckets:
            calls, moved, cost = per.get((collective, bucket.name), [0.0, 0.0, 0.0])
            loads.append(
                BucketLoad(
                    collective,
                    bucket,
                    calls,
                    moved,
                    cost if source != "bytes" else None,
                    cost / total if total > 0 else 0.0,
                )
            )
    return WorkloadWeights(tuple(loads), source, job, total if source != "bytes" else None, oversized)


def _samples(baseline: Measurements, collective: Collective) -> list[tuple[int, float]]:
    return sorted((s.bytes, s.time_us) for s in baseline.samples if s.collective == collective.value and s.bytes > 0)


def _baseline_time(samples: Sequence[tuple[int, float]], size: int) -> float:
    """The baseline's time at ``size``: log-log between measured sizes, flat below, linear in bytes above."""
    sizes = [s for s, _ in samples]
    if size <= sizes[0]:
        return samples[0][1]
    if size >= sizes[-1]:
        return samples[-1][1] * size / sizes[-1]
    i = bisect.bisect_left(sizes, size)
    (s0, t0), (s1, t1) = samples[i - 1], samples[i]
    if s1 == size:
        return t1
    f = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
    return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
