"""The objective: how good one trial's measurements are, relative to the baseline's.

Purpose: per (collective, size bucket) a score — bus bandwidth for bandwidth-bound buckets, time for latency-
bound ones (never nccl-tests' "Avg bus bandwidth", a mean over every size of a sweep) — and the study
objective, the workload-weighted geometric mean of the per-bucket speedups over the baseline. Partial values
over the sizes measured so far are the intermediate values a pruner sees along the size ladder.

A speedup of one size is the baseline's time over the trial's time (equal to the ratio of bus bandwidths at
that size); a bucket's speedup is the geometric mean over its sizes, so no single size dominates.

Non-goals: statistics over repeats (``statistics``), and measuring.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from topo_tune.config.cluster import WorkloadConfig
from topo_tune.errors import ConfigError
from topo_tune.ids import BucketName
from topo_tune.nccl.collectives import Collective

__all__ = [
    "COLLECTIVES",
    "DEFAULT_BUCKETS",
    "DEFAULT_LADDER",
    "BucketScore",
    "Measurements",
    "Objective",
    "SizeBucket",
    "SizeSample",
    "WorkloadProfile",
]

COLLECTIVES = tuple(c.value for c in Collective)
"""Collectives by their nccl-tests names, as the benchmark backends and the sim model spell them."""


@dataclass(frozen=True)
class SizeBucket:
    """An inclusive range of message sizes scored together; latency-bound buckets are scored by time."""

    name: BucketName
    min_bytes: int
    max_bytes: int
    latency_bound: bool

    def holds(self, size: int) -> bool:
        return self.min_bytes <= size <= self.max_bytes


# The bins of NVIDIA's optimize_config.py (0–1K, 1K–64K, 64K–1M, 1M–16M, 16M–4G); the tuner plugin's ranges.
DEFAULT_BUCKETS = (
    SizeBucket(BucketName("0-1K"), 0, 1024, latency_bound=True),
    SizeBucket(BucketName("1K-64K"), 1025, 65536, latency_bound=True),
    SizeBucket(BucketName("64K-1M"), 65537, 1048576, latency_bound=True),
    SizeBucket(BucketName("1M-16M"), 1048577, 16777216, latency_bound=False),
    SizeBucket(BucketName("16M-4G"), 16777217, 4294967295, latency_bound=False),
)

DEFAULT_LADDER = tuple(1 << p for p in range(8, 31, 2))
"""256 B … 1 GiB by factors of 4: at least one size in every default bucket."""


@dataclass(frozen=True)
class SizeSample:
    """One collective at one size, as a benchmark reported it (nccl-tests' time and busbw)."""

    collective: str
    bytes: int
    time_us: float
    busbw_gbs: float
    algorithm: str | None = None  # what NCCL ran, when the backend knows (sim, NCCL_DEBUG=TUNING)
    protocol: str | None = None
    channels: int | None = None
    offered: tuple[str, ...] = ()
    """The ``algorithm/protocol`` entries NCCL offered at this size (tuner-table names), when the backend knows."""
    nccl: str = ""
    """NCCL's own pick among them (what ran unless a tuner row applied)."""

    def __post_init__(self) -> None:
        if not (self.time_us > 0 and math.isfinite(self.time_us)):
            raise ConfigError(
                f"measurements[{self.collective}@{self.bytes}].time_us", f"must be > 0, got {self.time_us}"
            )
        if not (self.busbw_gbs >= 0 and math.isfinite(self.busbw_gbs)):
            raise ConfigError(
                f"measurements[{self.collective}@{self.bytes}].busbw_gbs", f"must be >= 0, got {self.busbw_gbs}"
            )


@dataclass(frozen=True)
class Measurements:
    """What a benchmark returned for one configuration: samples per (collective, size)."""

    samples: tuple[SizeSample, ...]
    simulated: bool = False

    def __post_init__(self) -> None:
        seen: set[tuple[str, int]] = set()
        for s in self.samples:
            key = (s.collective, s.bytes)
            if key in seen:
                raise ConfigError("measurements", f"{s.collective} at {s.bytes} bytes reported twice")
            seen.add(key)

    def get(self, collective: str, size: int) -> SizeSample | None:
        for s in self.samples:
            if s.collective == collective and s.bytes == size:
                return s
        return None

    def keys(self) -> set[tuple[str, int]]:
        return {(s.collective, s.bytes) for s in self.samples}

    def merged(self, other: Measurements) -> Measurements:
        return Measurements(self.samples + other.samples, simulated=self.simulated or other.simulated)

    def to_json(self) -> str:
        return json.dumps(
            {
                "simulated": self.simulated,
                "samples": [
                    [s.collective, s.bytes, s.time_us, s.busbw_gbs, s.algorithm, s.protocol, s.channels]
                    + ([list(s.offered), s.nccl] if s.offered else [])
                    for s in self.samples
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Measurements:
        data = json.loads(text)
        # Samples stored before NCCL's choices were reported have seven fields.
        return cls(
            tuple(
                SizeSample(c, int(b), float(t), float(bw), a, p, ch, tuple(rest[0]) if rest else (), *rest[1:])
                for c, b, t, bw, a, p, ch, *rest in data["samples"]
            ),
            simulated=bool(data["simulated"]),
        )


@dataclass(frozen=True)
class WorkloadProfile:
    """How much each collective and each size bucket matters to the cluster's jobs (relative weights)."""

    collectives: Mapping[str, float]
    buckets: Mapping[BucketName, float] = field(default_factory=dict)
    matrix: Mapping[str, Mapping[BucketName, float]] | None = None
    """Per (collective, bucket) weights (``workload.weights``); a pair it does not name weighs 0."""

    def __post_init__(self) -> None:
        if not self.collectives:
            raise ConfigError("workload.collectives", "name at least one collective")
        for name, weight in self.collectives.items():
            if name not in COLLECTIVES:
                raise ConfigError(
                    f"workload.collectives.{name}", f"unknown collective; known: {', '.join(COLLECTIVES)}"
                )
            _check_weight(f"workload.collectives.{name}", weight)
        for name, weight in self.buckets.items():
            _check_weight(f"workload.buckets.{name}", weight)
        if sum(self.collectives.values()) <= 0:
            raise ConfigError("workload.collectives", "the weights must not all be zero")
        if self.matrix is not None:
            for name, row in self.matrix.items():
                if name not in COLLECTIVES:
                    raise ConfigError(
                        f"workload.weights.{name}", f"unknown collective; known: {', '.join(COLLECTIVES)}"
                    )
                for bucket, weight in row.items():
                    _check_weight(f"workload.weights.{name}.{bucket}", weight)
            object.__setattr__(
                self, "matrix", MappingProxyType({c: MappingProxyType(dict(r)) for c, r in self.matrix.items()})
            )
        object.__setattr__(self, "collectives", MappingProxyType(dict(self.collectives)))
        object.__setattr__(self, "buckets", MappingProxyType(dict(self.buckets)))

    def weight(self, collective: str, bucket: BucketName) -> float:
        """The weight of one (collective, bucket): from ``matrix`` when given (unnamed: 0), else the product of
        the collective's weight and the bucket's (a bucket the profile does not name weighs 1)."""
        if self.matrix is not None:
            return self.matrix.get(collective, {}).get(bucket, 0.0)
        return self.collectives.get(collective, 0.0) * self.buckets.get(bucket, 1.0)

    @property
    def bucket_names(self) -> set[BucketName]:
        """Every bucket the profile names."""
        return set(self.buckets) | {b for row in (self.matrix or {}).values() for b in row}


def _check_weight(path: str, weight: float) -> None:
    if not (isinstance(weight, int | float) and math.isfinite(weight) and weight >= 0):
        raise ConfigError(path, f"weight must be a finite number >= 0, got {weight!r}")


@dataclass(frozen=True)
class BucketScore:
    """One (collective, bucket) of a trial against the baseline."""

    collective: str
    bucket: SizeBucket
    speedup: float  # > 1: the trial is faster
    score: float  # the trial's busbw (GB/s, bandwidth-bound) or time (µs, latency-bound), geometric mean
    baseline_score: float
    sizes: tuple[int, ...]

    @property
    def unit(self) -> str:
        return "us" if self.bucket.latency_bound else "GB/s"


@dataclass(frozen=True)
class Objective:
    """Scores trials against the baseline's measurements for one workload profile."""

    profile: WorkloadProfile
    buckets: tuple[SizeBucket, ...] = DEFAULT_BUCKETS

    def __post_init__(self) -> None:
        names = [b.name for b in self.buckets]
        if len(set(names)) != len(names):
            raise ConfigError("buckets", f"bucket names must be unique, got {names}")
        unknown = sorted(self.profile.bucket_names - set(names))
        if unknown:
            where = "buckets" if unknown[0] in self.profile.buckets else "weights.*"
            raise ConfigError(f"workload.{where}.{unknown[0]}", f"no such bucket; buckets: {', '.join(names)}")

    @property
    def collectives(self) -> tuple[str, ...]:
        return tuple(c for c in COLLECTIVES if self.profile.collectives.get(c, 0.0) > 0)

    def bucket_of(self, size: int) -> SizeBucket | None:
        for bucket in self.buckets:
            if bucket.holds(size):
                return bucket
        return None

    def bucket_scores(self, trial: Measurements, baseline: Measurements) -> list[BucketScore]:
        """Per (collective, bucket) speedups over the sizes both measurements hold."""
        scores = []
        for collective in self.collectives:
            for bucket in self.buckets:
                pairs = [
                    (t, b)
                    for size in sorted({s.bytes for s in trial.samples if s.collective == collective})
                    if bucket.holds(size)
                    and (t := trial.get(collective, size)) is not None
                    and (b := baseline.get(collective, size)) is not None
                ]
                if not pairs:
                    continue
                speedup = _geomean(b.time_us / t.time_us for t, b in pairs)
                if bucket.latency_bound:
                    score, base = _geomean(t.time_us for t, _ in pairs), _geomean(b.time_us for _, b in pairs)
                else:
                    score = _geomean(max(t.busbw_gbs, 1e-12) for t, _ in pairs)
                    base = _geomean(max(b.busbw_gbs, 1e-12) for _, b in pairs)
                scores.append(BucketScore(collective, bucket, speedup, score, base, tuple(t.bytes for t, _ in pairs)))
        return scores

    def value(self, trial: Measurements, baseline: Measurements) -> float:
        """The weighted geometric mean speedup over the buckets measured so far (1.0 = the baseline)."""
        return self.combine(self.bucket_scores(trial, baseline))

    def combine(self, scores: Iterable[BucketScore]) -> float:
        total = 0.0
        weight_sum = 0.0
        for s in scores:
            w = self.profile.weight(s.collective, s.bucket.name)
            total += w * math.log(s.speedup)
            weight_sum += w
        if weight_sum <= 0:
            raise ConfigError("measurements", "no weighted (collective, bucket) was measured by both sides")
        return math.exp(total / weight_sum)

    def rungs(self, ladder: Sequence[int], count: int) -> list[tuple[int, ...]]:
        """The size ladder cut into ``count`` ascending stages, each ending on a bucket boundary when it can."""
        sizes = sorted(set(ladder))
        if not sizes:
            raise ConfigError("ladder", "must hold at least one size")
        if count < 1:
            raise ConfigError("rungs", f"must be at least 1, got {count}")
        groups: list[list[int]] = []
        for size in sizes:
            bucket = self.bucket_of(size)
            if groups and self.bucket_of(groups[-1][-1]) == bucket:
                groups[-1].append(size)
            else:
                groups.append([size])
        # A rung of sizes the workload weighs 0 gives no partial value to report or prune on: such sizes join
        # the next weighted group (the last one, at the top of the ladder).
        weighted: list[list[int]] = []
        pending: list[int] = []
        for group in groups:
            pending.extend(group)
            if self._weighted(group[0]):
                weighted.append(pending)
                pending = []
        if not weighted:
            ranges = [f"{b.min_bytes}-{b.max_bytes}" for b in self.buckets if self._weighted(b.min_bytes)]
            raise ConfigError(
                "workload.buckets",
                f"no size of the ladder ({', '.join(map(str, sizes))} bytes) falls in a bucket weighted above 0 "
                f"(those hold {', '.join(ranges) or 'no size'} bytes)",
            )
        weighted[-1].extend(pending)
        groups = weighted
        count = min(count, len(groups))
        per = len(groups) / count
        return [tuple(s for g in groups[round(i * per) : round((i + 1) * per)] for s in g) for i in range(count)]

    def weighted_sizes(self, ladder: Iterable[int]) -> tuple[int, ...]:
        """The sizes of ``ladder`` in a bucket some collective weighs above 0, ascending."""
        return tuple(s for s in sorted(set(ladder)) if self._weighted(s))

    def _weighted(self, size: int) -> bool:
        bucket = self.bucket_of(size)
        return bucket is not None and any(self.profile.weight(c, bucket.name) > 0 for c in self.collectives)


def _geomean(values: Iterable[float]) -> float:
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs))


def workload_profile(workload: WorkloadConfig) -> WorkloadProfile:
    """The tuner's profile of cluster.yaml's ``workload``: per-(collective, bucket) weights when it has them."""
    matrix = None if workload.weights is None else {c: dict(row) for c, row in workload.weights.items()}
    return WorkloadProfile(dict(workload.collectives), dict(workload.buckets), matrix)
