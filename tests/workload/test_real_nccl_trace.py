"""``topo-tune workload import`` on what a real NCCL job wrote on an H200: its profiler trace and plugin record.

``tests/fixtures/workload/h200_ddp_nccl_world1/`` holds one run of ``benchmarks/ddp_train.py`` under
``topo-tune exec --record-workload`` (torchrun, one process, one H200, NCCL 2.28.9, torch 2.11):
``rank0.json.gz`` is the trace of its 3 profiled steps (CPU and CUDA activity, ``record_shapes``; only the
``traceName`` path was cut to the file's name), ``topo-tune-workload.vm.824.0.txt`` the tuner plugin's record
of the same process. The job's DDP buckets are exactly 1, 64, 16, 4 and 1 MiB of float32 gradients per step
(benchmarks/results/h200-multi-gpu-job.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.ddp_train import bucket_bytes
from tests.support.processes import run_cli
from topo_tune.errors import WorkloadFileError
from topo_tune.nccl.collectives import Collective
from topo_tune.workload.calls import per_rank
from topo_tune.workload.file_kinds import read_workload_file

RUN = Path(__file__).resolve().parent.parent / "fixtures" / "workload" / "h200_ddp_nccl_world1"
TRACE = RUN / "rank0.json.gz"
RECORD = RUN / "topo-tune-workload.vm.824.0.txt"
STEPS = 3
MIB = 2**20


def test_the_real_nccl_trace_gives_each_ddp_bucket_once_per_step() -> None:
    calls = read_workload_file(TRACE)
    assert calls.kind == "pytorch-trace" and not calls.skipped
    counted = {(collective, size): stats.calls for (collective, size), stats in calls.calls.items()}
    # record_param_comms rows: allreduce, Float, In msg nelems 262144 (x6), 1048576, 4194304, 16777216 (x3 each).
    assert counted == {
        (Collective.ALL_REDUCE, 1 * MIB): 2 * STEPS,
        (Collective.ALL_REDUCE, 4 * MIB): STEPS,
        (Collective.ALL_REDUCE, 16 * MIB): STEPS,
        (Collective.ALL_REDUCE, 64 * MIB): STEPS,
    }
    assert sorted(bucket_bytes()) == [1 * MIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB], "the job's own buckets"
    # One rank: NCCL launches no kernel for an all_reduce, so the trace carries no collective durations.
    assert not per_rank([calls]).timed


def test_the_cli_prints_the_real_traces_calls_and_bytes_per_bucket() -> None:
    result = run_cli("workload", "import", str(TRACE))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "64K-1M: 0.023256  # 6 calls, 6291456 bytes" in out
    assert "1M-16M: 0.232558  # 6 calls, 62914560 bytes" in out
    assert "16M-4G: 0.744186  # 3 calls, 201326592 bytes" in out
    assert "weights from bytes moved (no times were available)" in out


def test_the_one_rank_plugin_record_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFileError, match="one-rank communicator: NCCL does not ask the plugin"):
        per_rank([read_workload_file(RECORD)])
    cluster = tmp_path / "cluster.yaml"
    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "local-gloo.yaml", cluster)
    before = cluster.read_text()
    result = run_cli("workload", "import", str(RECORD), "--cluster-config", str(cluster), "--write")
    assert result.returncode != 0
    assert "no collective call to weigh" in result.stderr and RECORD.name in result.stderr
    assert cluster.read_text() == before and not (tmp_path / "cluster.yaml.bak").exists()
