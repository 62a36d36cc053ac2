"""Production jobs' timing records: divergent ranks are named, and arms are compared per size class with the
proof's statistics (jobs as independent samples). The records here are synthetic, with known effects."""

from __future__ import annotations

import math
import random

import pytest

from topo_tune.errors import ConfigError
from topo_tune.learning.assignment import ArmIndex
from topo_tune.learning.evidence import compare_arms, divergence, job_timing
from topo_tune.plugin.timing_record import TimingCell, TimingRecord
from topo_tune.tuner.statistics import Decision

CHOSEN, CHALLENGER = ArmIndex(0), ArmIndex(1)


def cell(collective: str, class_bytes: int, ns: float, *, calls: int = 30, timed: int = 10) -> TimingCell:
    ln = math.log(ns)
    return TimingCell(
        collective,
        class_bytes,
        "ring/simple",
        calls,
        timed,
        int(ns * timed),
        int(ns),
        int(ns),
        ln * timed,
        ln * ln * timed,
    )


def record(*, comm: int = 1, rank: int = 0, arm: int | None = 0, cells: tuple[TimingCell, ...] = ()) -> TimingRecord:
    return TimingRecord("node-1:1", comm, rank, 2, 1, 3, arm, 0, 0, cells)


def job(arm: ArmIndex, rng: random.Random, *, large: float) -> list[TimingRecord]:
    """A 2-rank job: a 1 KiB all_reduce the arms run alike and a 16 MiB one whose time ``large`` scales;
    jobs differ by up to ±3% (nodes, load), ranks of one job alike."""
    noise = math.exp(rng.gauss(0, 0.015))
    cells = (cell("allreduce", 1024, 20_000 * noise), cell("allreduce", 1 << 24, 900_000 * large * noise))
    return [record(rank=r, arm=arm, cells=cells) for r in (0, 1)]


def jobs(challenger_scale: float, *, per_arm: int, seed: int = 3) -> list:
    rng = random.Random(seed)
    out = [job_timing(job(CHOSEN, rng, large=1.0)) for _ in range(per_arm)]
    return out + [job_timing(job(CHALLENGER, rng, large=challenger_scale)) for _ in range(per_arm)]


def decisions(results: list) -> dict[int, Decision]:
    return {r.class_bytes: r.decision for r in results}


def test_a_faster_challenger_is_shown_faster_where_it_differs_and_safe_where_it_does_not() -> None:
    results = compare_arms(jobs(1 / 1.10, per_arm=20), arm=CHALLENGER)
    assert decisions(results) == {1024: Decision.NO_DIFFERENCE, 1 << 24: Decision.FASTER}
    large = next(r for r in results if r.class_bytes == 1 << 24)
    assert large.comparison.ci_low < 1.10 < large.comparison.ci_high and large.comparison.pairs == 20


def test_a_slower_challenger_is_shown_slower() -> None:
    assert decisions(compare_arms(jobs(1.10, per_arm=20), arm=CHALLENGER))[1 << 24] is Decision.SLOWER


def test_few_jobs_show_nothing_safe_and_one_job_per_arm_is_not_compared() -> None:
    assert decisions(compare_arms(jobs(1.0, per_arm=3), arm=CHALLENGER)) == {
        1024: Decision.NOT_SHOWN_SAFE,
        1 << 24: Decision.NOT_SHOWN_SAFE,
    }
    assert compare_arms(jobs(1.0, per_arm=1), arm=CHALLENGER) == []


def test_a_job_is_one_sample_whatever_its_rank_count() -> None:
    rng = random.Random(1)
    small = job_timing(job(CHOSEN, rng, large=1.0))
    assert small.timed[("allreduce", 1024)] == 20, "both ranks' timed calls pooled into the job's value"
    assert small.log_means[("allreduce", 1024)] == pytest.approx(math.log(20_000), abs=0.1)


def test_a_job_whose_records_name_different_arms_or_none_is_refused() -> None:
    with pytest.raises(ConfigError, match="one arm"):
        job_timing([record(arm=0), record(rank=1, arm=1)])
    with pytest.raises(ConfigError, match="one arm"):
        job_timing([record(arm=None)])
    with pytest.raises(ConfigError, match="arm"):
        compare_arms([], arm=CHOSEN)


def test_ranks_that_ran_something_else_or_a_missing_rank_are_named() -> None:
    agree = (cell("allreduce", 1024, 1e4),)
    assert divergence([record(rank=0, cells=agree), record(rank=1, cells=agree)]) == []
    other = (TimingCell("allreduce", 1024, "tree/ll", 30, 10, 1, 1, 1, 1.0, 1.0),)
    assert divergence([record(rank=0, cells=agree), record(rank=1, cells=other)]) == [
        "comm 1: rank 1 ran allreduce 1024 ring/simple 0 times, rank 0 30"
    ]
    fewer = (cell("allreduce", 1024, 1e4, calls=29),)
    assert divergence([record(rank=0, cells=agree), record(rank=1, cells=fewer)]) == [
        "comm 1: rank 1 ran allreduce 1024 ring/simple 29 times, rank 0 30"
    ]
    assert divergence([record(comm=0xF, rank=0, cells=agree)]) == ["comm f: records from 1 of its 2 ranks"]
