"""The tuner plugin's record of what NCCL offered and chose per call (TOPOTUNE_TUNER_RECORD)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin.nccl_tuner_harness import (
    ALLGATHER,
    ALLREDUCE,
    LL,
    LOG_WARN,
    RING,
    SIMPLE,
    TREE,
    TunerLibrary,
    nccl_like_table,
)
from topo_tune.errors import RecordError
from topo_tune.plugin.record import RECORD_ENV, parse_record

MIB = 1024 * 1024
# nccl_like_table: tree/LL128, CollNet and NVLS ruled out; tree/LL is NCCL's cheapest (10.0).
OFFERED = ("tree/ll", "tree/simple", "ring/ll", "ring/ll128", "ring/simple", "pat/ll", "pat/ll128", "pat/simple")


@pytest.fixture
def record_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "record.csv"
    monkeypatch.setenv(RECORD_ENV, str(path))
    return path


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_each_call_is_recorded_once_with_offered_chosen_and_applied(
    tuner: TunerLibrary, table_file: Path, record_file: Path, version: int
) -> None:
    table_file.write_text("allreduce,1048577,4294967295,ring,simple,8,-1,-1\n")
    comm = tuner.init(version, n_ranks=16, n_nodes=2)
    for n_bytes in (MIB, 64 * MIB, MIB):  # the repeated call adds no line
        comm.coll_info(ALLREDUCE, n_bytes, nccl_like_table())
    comm.coll_info(ALLGATHER, MIB, nccl_like_table())
    comm.finalize()

    calls = parse_record(record_file.read_text())

    assert [(c.collective, c.bytes) for c in calls] == [("allreduce", MIB), ("allreduce", 64 * MIB), ("allgather", MIB)]
    small, large, gather = calls
    assert small.offered == large.offered == gather.offered == OFFERED, "ruled-out (-1) entries are never offered"
    assert (small.nccl, small.applied, small.channels) == ("tree/ll", "tree/ll", None), "no row: NCCL's choice ran"
    assert (large.nccl, large.applied, large.channels) == ("tree/ll", "ring/simple", 8), "the row's entry ran"
    assert (large.n_nodes, large.n_ranks, large.num_pipe_ops) == (2, 16, 1)
    assert large.reg_buff == (-1 if version == 3 else 0), "v3 has no regBuff"


def test_nccls_choice_is_the_first_cheapest_offered_entry(
    tuner: TunerLibrary, table_file: Path, record_file: Path
) -> None:
    table_file.write_text("")
    comm = tuner.init(5, n_ranks=8, n_nodes=1)
    table = nccl_like_table()
    table.cells[TREE * 3 + LL] = -1.0  # NCCL ruled tree/LL out: ring/LL (13.0) and tree/simple (12.0) remain
    table.cells[RING * 3 + SIMPLE] = 12.0  # a tie with tree/simple: NCCL keeps the first, algorithm-major
    comm.coll_info(ALLREDUCE, 4096, table)
    comm.finalize()

    (call,) = parse_record(record_file.read_text())

    assert call.nccl == call.applied == "tree/simple"
    assert "tree/ll" not in call.offered


def test_several_communicators_append_to_one_record(tuner: TunerLibrary, table_file: Path, record_file: Path) -> None:
    table_file.write_text("")
    first, second = tuner.init(5, n_ranks=8, n_nodes=1), tuner.init(5, n_ranks=16, n_nodes=2)
    first.coll_info(ALLREDUCE, MIB, nccl_like_table())
    second.coll_info(ALLREDUCE, MIB, nccl_like_table())
    tuner.finalize_all()

    text = record_file.read_text()

    assert text.count("collective,bytes") == 1, "one header"
    assert [(c.n_nodes, c.n_ranks) for c in parse_record(text)] == [(1, 8), (2, 16)]


def test_without_the_variable_nothing_is_written(tuner: TunerLibrary, table_file: Path, tmp_path: Path) -> None:
    table_file.write_text("allreduce,0,4294967295,ring,simple,-1,-1,-1\n")
    comm = tuner.init(5, n_ranks=8, n_nodes=1)
    table = nccl_like_table()
    comm.coll_info(ALLREDUCE, MIB, table)
    assert table[RING, SIMPLE] == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuner-table.csv"]


def test_an_unwritable_record_is_reported_and_the_table_still_applies(
    tuner: TunerLibrary, table_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "missing-dir" / "record.csv"))
    table_file.write_text("allreduce,0,4294967295,ring,simple,4,-1,-1\n")
    comm = tuner.init(5, n_ranks=8, n_nodes=1)
    table = nccl_like_table()

    channels = comm.coll_info(ALLREDUCE, MIB, table)

    assert (table[RING, SIMPLE], channels) == (0.0, 4)
    warnings = [r.message for r in comm.records if r.level == LOG_WARN]
    assert any("cannot open the record" in w and "missing-dir" in w for w in warnings), warnings


def test_a_malformed_record_line_is_refused_naming_the_line() -> None:
    with pytest.raises(RecordError, match=r"record:2: expected 10"):
        parse_record("allreduce,1,1,0,1,8,ring/ll,ring/ll,-1,ring/ll\nallreduce,2\n")
    with pytest.raises(RecordError, match=r"record:1: .*integers"):
        parse_record("allreduce,x,1,0,1,8,ring/ll,ring/ll,-1,ring/ll\n")
