"""The tuner plugin's call counts (TOPO_TUNE_WORKLOAD_DIR): counted in getCollInfo, written at finalize."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin.nccl_tuner_harness import ALLGATHER, ALLREDUCE, LOG_WARN, TunerLibrary, nccl_like_table
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin.job_env import WORKLOAD_ENV, workload_env
from topo_tune.workload.calls import per_rank
from topo_tune.workload.file_kinds import read_workload_file
from topo_tune.workload.plugin_record import LOWER_BOUND

MIB = 1 << 20
SEND_RECV = 5  # ncclFuncSendRecv: not a collective the tuner measures


@pytest.mark.parametrize("version", [3, 6])
def test_known_calls_are_counted_per_size_class_and_written_at_finalize(
    tuner: TunerLibrary, table_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    table_file.write_text("allreduce,1048577,4294967295,ring,simple,8,-1,-1\n")
    counts = tmp_path / "counts"
    counts.mkdir()
    monkeypatch.setenv(WORKLOAD_ENV, str(counts))
    comm = tuner.init(version, n_ranks=16, n_nodes=2)
    calls = [(ALLREDUCE, MIB)] * 3 + [(ALLREDUCE, MIB + 1), (ALLREDUCE, 3 * MIB), (ALLGATHER, 4096), (ALLGATHER, 0)]
    calls += [(SEND_RECV, 64), (99, 8)]
    for coll, n_bytes in calls:
        comm.coll_info(coll, n_bytes, nccl_like_table())
    assert not list(counts.iterdir()), "written at finalize, not before"
    comm.finalize()

    [written] = list(counts.iterdir())
    assert written.name.startswith("topo-tune-workload.") and written.name.endswith(".txt")
    header, process, *rows = written.read_text().splitlines()
    assert header == "topo-tune workload record 1"
    assert process.startswith("process ") and process.endswith(" nranks 16 nnodes 2")
    assert rows == [
        "allgather 1 1 0",  # size 0 is class 0
        "allgather 4096 1 4096",
        "allreduce 1048576 3 3145728",  # (512 KiB, 1 MiB]: exactly 1 MiB stays below the 1M-16M bucket
        "allreduce 2097152 1 1048577",  # (1 MiB, 2 MiB]: one byte more is the next class, and the next bucket
        "allreduce 4194304 1 3145728",
        "function5 64 1 64",
        "other_function 8 1 8",
    ]
    [calls_of] = [read_workload_file(written)]
    assert calls_of.kind == "plugin-record" and calls_of.lower_bound == LOWER_BOUND
    assert {(c, s): x.calls for (c, s), x in calls_of.calls.items()} == {
        (Collective.ALL_GATHER, 0): 1,
        (Collective.ALL_GATHER, 4096): 1,
        (Collective.ALL_REDUCE, MIB): 3,
        (Collective.ALL_REDUCE, MIB + 1): 1,
        (Collective.ALL_REDUCE, 3 * MIB): 1,
    }
    assert dict(calls_of.skipped) == {"function5": 1, "other_function": 1}
    assert per_rank([calls_of]).lower_bound == (LOWER_BOUND,)


def test_no_directory_no_count_and_a_missing_one_is_one_warning(
    tuner: TunerLibrary, table_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table_file.write_text("")
    monkeypatch.delenv(WORKLOAD_ENV, raising=False)
    comm = tuner.init(5, n_ranks=2, n_nodes=1)
    comm.coll_info(ALLREDUCE, MIB, nccl_like_table())
    comm.finalize()
    assert not list(tmp_path.glob("**/topo-tune-workload.*"))
    monkeypatch.setenv(WORKLOAD_ENV, str(tmp_path / "missing"))
    comm = tuner.init(5, n_ranks=2, n_nodes=1)
    comm.coll_info(ALLREDUCE, MIB, nccl_like_table())
    comm.finalize()
    warnings = [r.message for r in comm.records if r.level == LOG_WARN]
    assert len(warnings) == 1 and "not counting calls" in warnings[0] and "missing" in warnings[0]


def test_every_communicator_writes_its_own_file_and_never_overwrites(
    tuner: TunerLibrary, table_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table_file.write_text("")
    monkeypatch.setenv(WORKLOAD_ENV, str(tmp_path))
    first, second = tuner.init(5, n_ranks=8, n_nodes=1), tuner.init(5, n_ranks=2, n_nodes=1)
    first.coll_info(ALLREDUCE, 16 * MIB, nccl_like_table())
    second.coll_info(ALLREDUCE, 16 * MIB, nccl_like_table())
    first.finalize()
    second.finalize()
    files = sorted(tmp_path.glob("topo-tune-workload.*.txt"))
    assert len(files) == 2
    job = per_rank(read_workload_file(f) for f in files)
    assert {s: x.calls for (_, s), x in job.calls.items()} == {16 * MIB: 2}, "one process: its communicators add up"


def test_exec_record_workload_loads_the_plugin_and_names_the_directory(tmp_path: Path) -> None:
    library = tmp_path / "libnccl-tuner-topotune.so"
    table_env = {"NCCL_TUNER_PLUGIN": "/opt/other.so", "NCCL_TUNER_CONFIG_FILE": "/t.csv"}
    env = workload_env(tmp_path / "run" / "counts", library, table_env)
    assert env[WORKLOAD_ENV] == str(tmp_path / "run" / "counts") and (tmp_path / "run" / "counts").is_dir()
    assert env["NCCL_TUNER_PLUGIN"] == "/opt/other.so", "the version's own plugin settings win"
    assert workload_env(tmp_path / "c", library, {})["NCCL_TUNER_PLUGIN"] == str(library), "no table: loaded anyway"
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="cannot create"):
        workload_env(tmp_path / "file" / "sub", library, {})
