"""What real NCCL wrote with 2 ranks sharing one H200: the DDP job's trace and counters, and the plugin's view.

``tests/fixtures/workload/h200_ddp_nccl_2ranks_one_gpu/`` holds one run of ``benchmarks/ddp_train.py`` under
``topo-tune exec --record-workload`` (torchrun, 2 processes on one H200, NCCL 2.30.7 under MPS, torch 2.11;
``benchmarks/results/h200-one-gpu-ranks.md``): ``rank<R>.json.gz``, each rank's profiler trace of the 3 profiled
steps (``traceName`` cut to the file's name), and ``topo-tune-workload.vm.<pid>.0.txt``, each rank's plugin
counters over the whole job (5 warm-up + 20 timed + 3 profiled steps). Beside them, from one of that night's
``init`` benchmark jobs run by an agent in ``--ranks-per-gpu 2`` mode: ``candidate_table.csv``, the tuner table
the job was given, and ``tuner_record_rank<R>.csv``, the plugin's record of what NCCL offered and chose.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.ddp_train import bucket_bytes
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin.record import parse_record
from topo_tune.workload.file_kinds import read_workload_file

RUN = Path(__file__).resolve().parent.parent / "fixtures" / "workload" / "h200_ddp_nccl_2ranks_one_gpu"
MIB = 2**20
JOB_STEPS = 5 + 20 + 3
PROFILED_STEPS = 3


def _calls(path: Path) -> dict[tuple[Collective, int], int]:
    calls = read_workload_file(path)
    return {key: stats.calls for key, stats in calls.calls.items()}


def test_every_ranks_trace_gives_each_ddp_bucket_once_per_profiled_step() -> None:
    assert sorted(bucket_bytes()) == [1 * MIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
    for rank in (0, 1):
        assert _calls(RUN / f"rank{rank}.json.gz") == {
            (Collective.ALL_REDUCE, 1 * MIB): 2 * PROFILED_STEPS,
            (Collective.ALL_REDUCE, 4 * MIB): PROFILED_STEPS,
            (Collective.ALL_REDUCE, 16 * MIB): PROFILED_STEPS,
            (Collective.ALL_REDUCE, 64 * MIB): PROFILED_STEPS,
        }


def test_the_counters_agree_per_step_but_the_first_step_reached_the_plugin_as_one_call() -> None:
    counts = sorted(RUN.glob("topo-tune-workload.*.txt"))
    assert len(counts) == 2, "one counters' file per rank"
    whole_model = sum(bucket_bytes())
    for path in counts:
        calls = _calls(path)
        all_reduce = {size: n for (collective, size), n in calls.items() if collective is Collective.ALL_REDUCE}
        # The steps after the first: each bucket once a step, as the trace shows.
        steady = JOB_STEPS - 1
        assert all_reduce[1 * MIB] == 2 * steady
        assert all_reduce[4 * MIB] == all_reduce[16 * MIB] == all_reduce[64 * MIB] == steady
        # The first step's five buckets reached the plugin as one call of their summed bytes: one task NCCL built
        # from a group of calls (why that step's calls were grouped was not traced further). So calls per bucket
        # agree with the trace step by step, except in the first step.
        merged = [size for size, n in all_reduce.items() if n == 1 and size > 64 * MIB]
        assert len(merged) == 1
        text = path.read_text(encoding="utf-8")
        assert f"allreduce 134217728 1 {whole_model}" in text


def test_the_plugins_view_on_real_nccl_shows_the_tables_choice_applied_on_both_ranks() -> None:
    table = (RUN / "candidate_table.csv").read_text(encoding="utf-8")
    assert "allreduce,65537,1048576,tree,simple" in table
    for rank in (0, 1):
        calls = parse_record((RUN / f"tuner_record_rank{rank}.csv").read_text(encoding="utf-8"))
        sized = [c for c in calls if c.bytes >= 1 * MIB]
        assert {c.bytes for c in sized} == {1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB}
        for call in sized:
            assert call.n_ranks == 2 and call.n_nodes == 1
            assert "tree/simple" in call.offered
            assert call.applied == "tree/simple", call  # the table's row, over NCCL's own pick
        assert {c.bytes: c.nccl for c in sized if c.reg_buff == 0} == {
            1 * MIB: "ring/ll",
            4 * MIB: "ring/simple",
            16 * MIB: "ring/simple",
            64 * MIB: "ring/simple",
        }
        small = [c for c in calls if c.bytes < 64 * 1024]
        assert small and all(c.applied == c.nccl for c in small), "no row covers the 4-byte barrier: NCCL's pick"
