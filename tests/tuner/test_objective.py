"""The objective: per-bucket speedups, workload weights, the size-ladder rungs."""

from __future__ import annotations

import math

import pytest

from topo_tune.errors import ConfigError
from topo_tune.tuner.objective import DEFAULT_LADDER, Measurements, Objective, SizeSample, WorkloadProfile


def sweep(times: dict[tuple[str, int], float]) -> Measurements:
    return Measurements(tuple(SizeSample(c, s, t, s / (t * 1e3)) for (c, s), t in times.items()))


def test_the_objective_is_the_weighted_geometric_mean_of_bucket_speedups() -> None:
    objective = Objective(WorkloadProfile({"all_reduce": 3, "all_gather": 1}))
    sizes = (1024, 1 << 20, 1 << 28)
    base = sweep({(c, s): 100.0 for c in ("all_reduce", "all_gather") for s in sizes})
    faster_reduce = sweep(
        {(c, s): 50.0 if c == "all_reduce" else 100.0 for c in ("all_reduce", "all_gather") for s in sizes}
    )
    assert objective.value(base, base) == pytest.approx(1.0)
    # all_reduce 2x in every bucket, weight 3 of 4: exp(3/4 ln 2).
    assert objective.value(faster_reduce, base) == pytest.approx(math.exp(0.75 * math.log(2)))


def test_latency_bound_buckets_score_time_and_bandwidth_bound_ones_busbw() -> None:
    objective = Objective(WorkloadProfile({"all_reduce": 1}))
    base = sweep({("all_reduce", 1024): 20.0, ("all_reduce", 1 << 28): 2000.0})
    trial = sweep({("all_reduce", 1024): 10.0, ("all_reduce", 1 << 28): 1000.0})
    scores = {s.bucket.name: s for s in objective.bucket_scores(trial, base)}
    assert scores["0-1K"].unit == "us" and scores["0-1K"].score == pytest.approx(10.0)
    assert scores["16M-4G"].unit == "GB/s" and scores["16M-4G"].score > scores["16M-4G"].baseline_score
    assert [s.speedup for s in scores.values()] == pytest.approx([2.0, 2.0])


def test_bucket_weights_steer_the_objective() -> None:
    only_large = Objective(WorkloadProfile({"all_reduce": 1}, {"0-1K": 0, "1K-64K": 0, "64K-1M": 0, "1M-16M": 0}))
    base = sweep({("all_reduce", 1024): 20.0, ("all_reduce", 1 << 28): 2000.0})
    slow_small = sweep({("all_reduce", 1024): 40.0, ("all_reduce", 1 << 28): 1000.0})
    assert only_large.value(slow_small, base) == pytest.approx(2.0)


def test_rungs_climb_the_ladder_and_cover_it_once() -> None:
    objective = Objective(WorkloadProfile({"all_reduce": 1}))
    rungs = objective.rungs(DEFAULT_LADDER, 3)
    assert len(rungs) == 3
    flat = [s for r in rungs for s in r]
    assert flat == sorted(DEFAULT_LADDER)
    assert max(rungs[0]) < min(rungs[1]) and max(rungs[1]) < min(rungs[2])


def test_bad_profiles_and_measurements_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"workload.collectives.allreduce"):
        WorkloadProfile({"allreduce": 1})
    with pytest.raises(ConfigError, match=r"workload.buckets.huge"):
        Objective(WorkloadProfile({"all_reduce": 1}, {"huge": 1}))
    with pytest.raises(ConfigError, match=r"time_us"):
        SizeSample("all_reduce", 8, 0.0, 1.0)
    with pytest.raises(ConfigError, match=r"reported twice"):
        Measurements((SizeSample("all_reduce", 8, 1.0, 1.0), SizeSample("all_reduce", 8, 2.0, 1.0)))


def test_measurements_survive_their_json_form() -> None:
    m = Measurements((SizeSample("all_reduce", 8, 1.5, 0.1, "Ring", "LL", 4),), simulated=True)
    assert Measurements.from_json(m.to_json()) == m


def test_measurements_keep_nccls_offered_entries_and_read_samples_stored_without_them() -> None:
    with_choice = SizeSample("all_reduce", 4096, 12.0, 1.0, "tree", "ll", 0, ("tree/ll", "ring/ll"), "tree/ll")
    plain = SizeSample("all_reduce", 8192, 14.0, 1.5)
    m = Measurements((with_choice, plain), simulated=True)
    assert Measurements.from_json(m.to_json()) == m
    stored = '{"simulated":false,"samples":[["all_reduce",4096,12.0,1.0,"Ring","LL",4]]}'
    assert Measurements.from_json(stored).samples[0] == SizeSample("all_reduce", 4096, 12.0, 1.0, "Ring", "LL", 4)
