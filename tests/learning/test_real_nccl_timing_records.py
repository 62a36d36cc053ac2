"""What topo-tune's profiler wrote inside a real DDP job: 2 ranks sharing one H200, NCCL 2.30.7 under MPS.

``tests/fixtures/learning/h200_ddp_nccl_2ranks_one_gpu/`` holds the timing records of four runs of
``benchmarks/ddp_train.py`` (1,000 steps, torchrun, 2 ranks on one GPU) from ``benchmarks/one_gpu_learning.sh``
(``benchmarks/results/h200-learning.md``): ``arm0-r<N>.*``, the chosen arm (an empty table, NCCL's own choices),
and ``arm1-r<N>.*``, the challenger (``challenger.csv``: ring/LL128 for all_reduce above 1 MiB up to 16 MiB), one
record per rank, the profiler timing 1 call in 8. A regression in the reader or in the evidence's arithmetic
shows here against files real NCCL produced, not only against synthetic ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from topo_tune.learning.assignment import ArmIndex
from topo_tune.learning.evidence import compare_arms, divergence, job_timing
from topo_tune.plugin.timing_record import TimingRecord, parse_timing_record

RUN = Path(__file__).resolve().parent.parent / "fixtures" / "learning" / "h200_ddp_nccl_2ranks_one_gpu"
MIB = 2**20
STEPS = 1000


def _job(name: str) -> list[TimingRecord]:
    paths = sorted(RUN.glob(f"{name}.topo-tune-timing.*.txt"))
    assert len(paths) == 2, paths
    return [parse_timing_record(p.read_text(encoding="utf-8"), source=p.name) for p in paths]


JOBS = ("arm0-r1", "arm0-r2", "arm1-r1", "arm1-r2")


@pytest.mark.parametrize("name", JOBS)
def test_every_rank_of_a_real_job_records_the_same_calls_and_samples_are_accounted_for(name: str) -> None:
    records = _job(name)
    assert divergence(records) == []
    assert sorted(r.rank for r in records) == [0, 1]
    assert {r.n_ranks for r in records} == {2}
    assert {r.sample for r in records} == {8}
    assert {r.arm for r in records} == {int(name[3])}
    # A sample whose events had not all arrived when its slot came round (or at finalize) is counted, not
    # timed: real NCCL left at most one per record in these runs (arm0-r2: one on each rank).
    assert all(r.unfinished <= 1 and r.overflow == 0 for r in records)


@pytest.mark.parametrize("name", JOBS)
def test_each_bucket_was_called_once_a_step_and_one_call_in_eight_was_timed(name: str) -> None:
    (record, _) = _job(name)
    calls = {(c.collective, c.class_bytes): (c.calls, c.timed) for c in record.cells}
    # DDP's buckets: 1 MiB twice a step, 4, 16 and 64 MiB once; a few untimed steps of warm-up come on top.
    for class_bytes, per_step in ((MIB, 2), (4 * MIB, 1), (16 * MIB, 1), (64 * MIB, 1)):
        n, timed = calls[("allreduce", class_bytes)]
        assert STEPS * per_step <= n <= (STEPS + 10) * per_step
        assert n // 8 - 2 <= timed <= n // 8 + 2


def test_the_challenger_table_ran_where_its_row_applies_and_nccl_chose_elsewhere() -> None:
    def choices(name: str) -> dict[int, str]:
        return {c.class_bytes: c.choice for c in _job(name)[0].cells if c.collective == "allreduce" and c.calls > 2}

    chosen, challenger = choices("arm0-r1"), choices("arm1-r1")
    assert challenger[4 * MIB] == challenger[16 * MIB] == "ring/ll128"
    assert chosen[4 * MIB] != "ring/ll128" and chosen[16 * MIB] != "ring/ll128"
    assert chosen[MIB] == challenger[MIB] and chosen[64 * MIB] == challenger[64 * MIB]


def test_the_real_records_compare_per_size_class() -> None:
    jobs = [job_timing(_job(name)) for name in JOBS]
    cells = {(c.collective, c.class_bytes): c for c in compare_arms(jobs, arm=ArmIndex(1))}
    assert {("allreduce", MIB), ("allreduce", 4 * MIB), ("allreduce", 16 * MIB), ("allreduce", 64 * MIB)} <= set(cells)
    for cell in cells.values():
        assert cell.comparison.pairs == 2
        assert cell.comparison.ci_low <= cell.comparison.speedup <= cell.comparison.ci_high
    # Two jobs an arm decide nothing: no cell is called faster.
    assert all(c.decision.value != "faster" for c in cells.values())
