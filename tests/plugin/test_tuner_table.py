"""The Python reader of the tuner table agrees with the plugin line for line, and refuses what the plugin skips."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin.nccl_tuner_harness import LOG_WARN, TunerLibrary
from topo_tune.errors import TunerTableError
from topo_tune.plugin import MAX_TABLE_BYTES, TunerRow, parse_tuner_table

MALFORMED = [
    "alltoall,0,1024,ring,simple,4,-1,-1",
    "allreduce,0,1024,ring,simple,4,-1",
    "allreduce,0,1024,ring,simple,4,-1,-1,1,0,extra",
    "allreduce,-5,1024,ring,simple,4,-1,-1",
    "allreduce,2048,1024,ring,simple,4,-1,-1",
    "allreduce,0,1k,ring,simple,4,-1,-1",
    "allreduce,0,1024,rings,simple,4,-1,-1",
    "allreduce,0,1024,ring,ll64,4,-1,-1",
    "allreduce,0,1024,ring,simple,0,-1,-1",
    "allreduce,0,1024,ring,simple,4,-1,-1,1,2",
    "allreduce,0,1024,ring,simple,4,,-1",
    "allreduce,0,1024,ring,simple,4,-1,-1,0",
    "allreduce,0,1024,-1,simple,4,-1,-1",
    "allreduce,0,1024,ring,-1,4,-1,-1",
    "allreduce,0,18446744073709551616,ring,simple,4,-1,-1",
]


@pytest.mark.parametrize("line", MALFORMED)
def test_a_malformed_line_is_refused_with_the_plugins_own_words(
    tuner: TunerLibrary, table_file: Path, line: str
) -> None:
    table_file.write_text(f"# header comment\n{line}\n")
    comm = tuner.init(5, n_ranks=2, n_nodes=1)
    [warning] = [r.message for r in comm.records if r.level == LOG_WARN]
    plugin_reason = warning.split("tuner-table.csv:2: ", 1)[1].removesuffix("; line skipped")

    with pytest.raises(TunerTableError) as caught:
        parse_tuner_table(f"# header comment\n{line}\n", source="candidate")

    assert caught.value.line == 2
    assert caught.value.reason == plugin_reason
    assert str(caught.value).startswith("candidate:2: ")


def test_valid_rows_are_read_as_the_plugin_binds_them(tuner: TunerLibrary, table_file: Path) -> None:
    text = (
        "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n"
        "  allreduce , 0 , 65536 , RING , LL , 16 , 1 , 2  \r\n"
        "\n"
        "allreduce,65537,1073741824,-1,-1,4,-1,-1\n"
        "allgather,0,1024,tree,simple,-1,2,16,4,0\n"
    )
    table_file.write_text(text)
    comm = tuner.init(5, n_ranks=2, n_nodes=1)
    assert not [r for r in comm.records if r.level == LOG_WARN]
    assert any("bound 2 of 3 rows" in m for m in comm.messages())

    rows = parse_tuner_table(text)

    assert rows == (
        TunerRow(2, "allreduce", 0, 65536, "ring", "ll", 16, 1, 2),
        TunerRow(4, "allreduce", 65537, 1073741824, None, None, 4, None, None),
        TunerRow(5, "allgather", 0, 1024, "tree", "simple", None, 2, 16, 4, 0),
    )
    assert [r.line for r in rows if r.fits(n_nodes=1, n_ranks=2)] == [2, 4]
    assert rows[0].applies("allreduce", 65536) and not rows[0].applies("allreduce", 65537)
    assert not rows[2].applies("allgather", 512), "a row for aggregated calls does not match a single call"


def test_a_table_over_the_size_limit_is_refused() -> None:
    row = "allreduce,0,1024,ring,simple,4,-1,-1\n"
    with pytest.raises(TunerTableError, match=f"more than the {MAX_TABLE_BYTES} allowed"):
        parse_tuner_table(row * (MAX_TABLE_BYTES // len(row) + 1))
