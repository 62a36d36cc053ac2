"""The cluster time a tuning pass reports: per phase wall time and node-seconds, and the fixed per-job cost."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from topo_tune.benchmark.job_record import BenchmarkJob, JobStatus, SizeRange
from topo_tune.benchmark.results import SizeMeasurement
from topo_tune.ids import JobId
from topo_tune.nccl.collectives import Collective
from topo_tune.tuning_pass.cluster_time import ClusterClock, collective_seconds, time_lines


def _job(*, simulated: bool, time_us: float = 1000.0, iters: int = 20, warmup: int = 5) -> BenchmarkJob:
    row = SizeMeasurement(
        bytes=1 << 20, count=1 << 18, in_place=False, time_us=time_us, algbw_gbps=1.0, busbw_gbps=1.0,
        wrong=0, checked=True, p50_us=time_us, p99_us=time_us, cv=0.0,
    )  # fmt: skip
    return BenchmarkJob(
        job_id=JobId("j"), status=JobStatus.SUCCEEDED, message="", collective=Collective.ALL_REDUCE,
        nodes=("a", "b"), world_size=2, dtype="float32", env={}, backend="gloo", sizes_requested=SizeRange(),
        iters=iters, warmup_iters=warmup, cuda_graph=False, tuner_table_sha256="",
        created_at=datetime(2026, 1, 1, tzinfo=UTC), simulated=simulated, sizes=(row, row),
    )  # fmt: skip


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_phase_holds_its_nodes_for_its_wall_time_and_the_total_is_their_sum() -> None:
    t = _Clock()
    clock = ClusterClock(simulated=False, clock=t)
    clock.begin("probe", nodes=4)
    t.now += 10
    clock.begin("search", nodes=4)
    t.now += 30
    clock.job(_job(simulated=False), wall_s=2.0)  # 2 rows × 1 ms × 25 loops = 50 ms of collectives
    clock.begin("outputs", nodes=0)
    t.now += 5
    clock.end()
    data = clock.to_json()
    walls = {p["phase"]: (p["wall_s"], p["node_s"]) for p in data["phases"]}
    assert walls == {"probe": (10.0, 40.0), "search": (30.0, 120.0), "outputs": (5.0, 0.0)}
    assert data["wall_s"] == pytest.approx(45.0) and data["node_s"] == pytest.approx(160.0)
    search = data["phases"][1]
    assert search["jobs"] == 1 and search["collective_s"] == pytest.approx(0.05)
    assert search["job_fixed_s"] == pytest.approx(1.95)
    assert data["simulated"] is False


def test_a_simulated_job_is_all_fixed_cost_and_says_simulated() -> None:
    clock = ClusterClock(simulated=True, clock=_Clock())
    clock.begin("proof", nodes=8)
    clock.job(_job(simulated=True), wall_s=0.15)
    clock.end()
    data = clock.to_json()
    assert data["phases"][0]["job_fixed_s"] == pytest.approx(0.15)
    assert data["phases"][0]["collective_s"] == 0.0
    lines = time_lines(data)
    assert "SIMULATED" in lines[0]
    assert lines[1].startswith("  proof: ") and "; 1 job, " in lines[1] and "0.15 s a job" in lines[1]


def test_a_running_phase_counts_up_to_now() -> None:
    t = _Clock()
    clock = ClusterClock(simulated=False, clock=t)
    clock.begin("search", nodes=2)
    t.now += 7
    assert clock.current == "search"
    assert clock.to_json()["wall_s"] == pytest.approx(7.0)


def test_collective_time_is_the_rows_times_the_loops() -> None:
    assert collective_seconds(_job(simulated=False, time_us=500.0, iters=10, warmup=2)) == pytest.approx(0.012)
