"""The tuner plugin, driven through NCCL's v3-v6 interfaces with synthetic cost tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin.nccl_tuner_harness import (
    ALLGATHER,
    ALLREDUCE,
    BROADCAST,
    IGNORE,
    LL,
    LL128,
    LOG_WARN,
    NVLS,
    PAT,
    REDUCESCATTER,
    RING,
    SIMPLE,
    TREE,
    CostTable,
    TunerLibrary,
    nccl_like_table,
)

KIB = 1024
MIB = 1024 * KIB

TABLE = """\
# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff
allreduce,0,65536,ring,ll,16,-1,-1
allreduce,65537,1048576,tree,simple,-1,-1,-1
allreduce,1048577,17179869184,ring,simple,8,-1,-1
allgather,0,4294967295,ring,ll128,4,-1,-1
"""


def changed_cells(before: list[float], table: CostTable) -> dict[int, tuple[float, float]]:
    return {i: (old, new) for i, (old, new) in enumerate(zip(before, table.snapshot(), strict=True)) if old != new}


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_every_exported_version_names_the_plugin(tuner: TunerLibrary, version: int) -> None:
    assert tuner.struct(version).name == b"TopoTune"


def test_only_the_plugin_structs_are_exported(tuner: TunerLibrary) -> None:
    # Internal functions stay hidden so they never clash with NCCL's or the application's symbols.
    for internal in ("ttInit", "ttGetCollInfo", "bindTable", "parseRow", "trim"):
        assert not hasattr(tuner.lib, internal), internal


def test_v6_leaves_chunk_sizes_to_nccl(tuner: TunerLibrary) -> None:
    assert tuner.struct(6).getChunkSize is None


@pytest.mark.parametrize("version", [3, 5])
@pytest.mark.parametrize(
    "call",
    [
        # (collective, nBytes) -> ((algorithm, protocol), channels)
        ((ALLREDUCE, 32 * KIB), ((RING, LL), 16)),
        ((ALLREDUCE, 65536), ((RING, LL), 16)),  # max_bytes is inclusive
        ((ALLREDUCE, 65537), ((TREE, SIMPLE), 0)),  # channels -1: NCCL keeps deciding
        ((ALLREDUCE, 512 * MIB), ((RING, SIMPLE), 8)),
        ((ALLGATHER, 1 * MIB), ((RING, LL128), 4)),
    ],
)
def test_the_chosen_entry_becomes_the_minimum_and_channels_follow_the_row(
    tuner: TunerLibrary,
    table_file: Path,
    version: int,
    call: tuple[tuple[int, int], tuple[tuple[int, int], int]],
) -> None:
    (coll, n_bytes), (chosen, channels) = call
    table_file.write_text(TABLE)
    comm = tuner.init(version, n_ranks=8, n_nodes=1)
    table = nccl_like_table()
    before = table.snapshot()

    n_channels = comm.coll_info(coll, n_bytes, table)

    assert table[chosen] == 0.0
    assert table.nccl_choice() == chosen
    assert list(changed_cells(before, table)) == [chosen[0] * 3 + chosen[1]], "only the chosen entry may change"
    assert n_channels == channels


@pytest.mark.parametrize("version", [3, 5])
def test_entries_nccl_ruled_out_stay_ruled_out(tuner: TunerLibrary, table_file: Path, version: int) -> None:
    # Row 1 asks for tree/LL128, which NCCL's LL128 gate turned off; row 2 (same range) is the fallback.
    table_file.write_text("allreduce,0,1048576,tree,ll128,32,-1,-1\nallreduce,0,1048576,ring,simple,-1,-1,-1\n")
    comm = tuner.init(version, n_ranks=8, n_nodes=1)
    table = nccl_like_table()

    n_channels = comm.coll_info(ALLREDUCE, 4 * KIB, table)

    assert table[TREE, LL128] == IGNORE
    assert n_channels == 0, "a row that was passed over must not set channels"
    assert table[RING, SIMPLE] == 0.0
    assert any("line 1: NCCL ruled out tree/ll128" in m for m in comm.messages())


@pytest.mark.parametrize("version", [3, 5])
def test_a_row_whose_only_entry_is_ruled_out_changes_nothing(
    tuner: TunerLibrary, table_file: Path, version: int
) -> None:
    table_file.write_text("allreduce,0,-0,nvls,simple,16,-1,-1\n".replace("-0", "1048576"))
    comm = tuner.init(version, n_ranks=8, n_nodes=1)
    table = nccl_like_table()
    before = table.snapshot()

    assert comm.coll_info(ALLREDUCE, 1024, table, n_channels=0) == 0
    assert table.snapshot() == before
    assert table[NVLS, SIMPLE] == IGNORE


@pytest.mark.parametrize("version", [3, 5])
@pytest.mark.parametrize(
    ("coll", "n_bytes"),
    [
        (BROADCAST, 1024),  # no row for broadcast
        (REDUCESCATTER, 1024),
        (ALLREDUCE, 17179869185),  # beyond every range
        (ALLGATHER, 4294967296),
        (7, 1024),  # a collective id NCCL may add later
    ],
)
def test_calls_without_a_matching_row_are_left_to_nccl(
    tuner: TunerLibrary, table_file: Path, version: int, coll: int, n_bytes: int
) -> None:
    table_file.write_text(TABLE)
    comm = tuner.init(version, n_ranks=8, n_nodes=1)
    table = nccl_like_table()
    before = table.snapshot()

    assert comm.coll_info(coll, n_bytes, table, n_channels=0) == 0
    assert table.snapshot() == before


def test_malformed_lines_are_reported_with_their_line_and_skipped(tuner: TunerLibrary, table_file: Path) -> None:
    table_file.write_text(
        "\n".join(
            [
                "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff",
                "alltoall,0,1024,ring,simple,4,-1,-1",  # 2: unknown collective
                "allreduce,0,1024,ring,simple,4,-1",  # 3: 7 fields
                "allreduce,0,1024,ring,simple,4,-1,-1,1,0,extra",  # 4: 11 fields
                "allreduce,-5,1024,ring,simple,4,-1,-1",  # 5: negative size
                "allreduce,2048,1024,ring,simple,4,-1,-1",  # 6: max below min
                "allreduce,0,1k,ring,simple,4,-1,-1",  # 7: not a number
                "allreduce,0,1024,rings,simple,4,-1,-1",  # 8: unknown algorithm
                "allreduce,0,1024,ring,ll64,4,-1,-1",  # 9: unknown protocol
                "allreduce,0,1024,ring,simple,0,-1,-1",  # 10: zero channels
                "allreduce,0,1024,ring,simple,4,-1,-1,1,2",  # 11: regBuff 2
                "allreduce,0,1024,ring,simple,4,,-1",  # 12: empty nNodes
                "  allreduce , 0 , 1024 , ring , LL , 2 , -1 , -1  \r",  # 13: valid, spaces, CRLF, case
                "",
                "   # an indented comment",
            ]
        )
        + "\n"
    )
    comm = tuner.init(5, n_ranks=8, n_nodes=1)
    warnings = [r.message for r in comm.records if r.level == LOG_WARN]

    expected = {
        2: "collective_type 'alltoall'",
        3: "got 7",
        4: "got 11",
        5: "min_bytes '-5'",
        6: "max_bytes 1024 is below min_bytes 2048",
        7: "max_bytes '1k'",
        8: "algorithm 'rings'",
        9: "protocol 'll64'",
        10: "channels '0'",
        11: "regBuff '2'",
        12: "nNodes ''",
    }
    assert len(warnings) == len(expected)
    for line_no, fragment in expected.items():
        assert any(f"tuner-table.csv:{line_no}: " in w and fragment in w for w in warnings), (
            line_no,
            warnings,
        )
    assert any("bound 1 of 12 rows" in m and "and 11 malformed lines" in m for m in comm.messages())

    table = nccl_like_table()
    assert comm.coll_info(ALLREDUCE, 512, table) == 2
    assert table.nccl_choice() == (RING, LL)


@pytest.mark.parametrize("version", [3, 5])
def test_an_unreadable_table_leaves_nccls_defaults(
    tuner: TunerLibrary, table_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    for path in (tmp_path / "missing.csv", tmp_path):  # absent, and a directory (opens, then fails to read)
        monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(path))
        comm = tuner.init(version, n_ranks=8, n_nodes=1)
        table = nccl_like_table()
        before = table.snapshot()

        assert comm.coll_info(ALLREDUCE, 1024, table) == 0
        assert table.snapshot() == before
        assert any(r.level == LOG_WARN and f"cannot read tuner table {path}" in r.message for r in comm.records), (
            comm.records
        )


def test_without_a_table_variable_nccl_decides(tuner: TunerLibrary, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_TUNER_CONFIG_FILE", raising=False)
    comm = tuner.init(5, n_ranks=8, n_nodes=1)
    table = nccl_like_table()
    before = table.snapshot()

    assert comm.coll_info(ALLREDUCE, 1024, table) == 0
    assert table.snapshot() == before
    assert any("NCCL_TUNER_CONFIG_FILE is not set" in m for m in comm.messages())


@pytest.mark.parametrize("version", [3, 5])
def test_rows_are_keyed_by_the_communicators_nodes_and_ranks(
    tuner: TunerLibrary, table_file: Path, version: int
) -> None:
    table_file.write_text(
        "allreduce,0,1048576,ring,ll,2,1,8\n"  # one node of 8
        "allreduce,0,1048576,tree,simple,4,2,16\n"  # two nodes of 8
        "allreduce,0,1048576,ring,simple,6,-1,16\n"  # any 16-rank communicator
    )
    cases = {(1, 8): ((RING, LL), 2), (2, 16): ((TREE, SIMPLE), 4), (4, 16): ((RING, SIMPLE), 6)}
    for (n_nodes, n_ranks), (chosen, channels) in cases.items():
        comm = tuner.init(version, n_ranks=n_ranks, n_nodes=n_nodes)
        table = nccl_like_table()
        assert comm.coll_info(ALLREDUCE, 1024, table) == channels, (n_nodes, n_ranks)
        assert table.nccl_choice() == chosen, (n_nodes, n_ranks)

    other = tuner.init(version, n_ranks=4, n_nodes=1)
    table = nccl_like_table()
    before = table.snapshot()
    assert other.coll_info(ALLREDUCE, 1024, table) == 0
    assert table.snapshot() == before
    assert any("bound 0 of 3 rows" in m and "skipped 3 rows for other communicators" in m for m in other.messages())


@pytest.mark.parametrize("version", [3, 5])
def test_the_table_is_bound_at_init_and_never_reread(tuner: TunerLibrary, table_file: Path, version: int) -> None:
    table_file.write_text("allreduce,0,1048576,ring,ll,2,-1,-1\n")
    comm = tuner.init(version, n_ranks=8, n_nodes=1)
    first = nccl_like_table()
    assert comm.coll_info(ALLREDUCE, 1024, first) == 2

    # A rollout replaces the file while the job runs: this communicator must keep choosing as it started.
    table_file.write_text("allreduce,0,1048576,tree,simple,8,-1,-1\n")
    for _ in range(3):
        table = nccl_like_table()
        assert comm.coll_info(ALLREDUCE, 1024, table) == 2
        assert table.nccl_choice() == (RING, LL)
    table_file.unlink()
    table = nccl_like_table()
    assert comm.coll_info(ALLREDUCE, 1024, table) == 2

    # A communicator created after the change gets the new table.
    table_file.write_text("allreduce,0,1048576,tree,simple,8,-1,-1\n")
    later = tuner.init(version, n_ranks=8, n_nodes=1)
    table = nccl_like_table()
    assert later.coll_info(ALLREDUCE, 1024, table) == 8
    assert table.nccl_choice() == (TREE, SIMPLE)


def test_pipe_ops_and_registered_buffers_select_rows(tuner: TunerLibrary, table_file: Path) -> None:
    table_file.write_text(
        "allreduce,0,1048576,ring,ll,2,-1,-1,4,-1\n"  # groups of 4 ops
        "allreduce,0,1048576,tree,simple,3,-1,-1,-1,1\n"  # registered buffers
        "allreduce,0,1048576,ring,simple,5,-1,-1\n"  # everything else
    )
    comm = tuner.init(5, n_ranks=8, n_nodes=1)
    expectations = [
        ({"num_pipe_ops": 4, "reg_buff": 0}, (RING, LL), 2),
        ({"num_pipe_ops": 1, "reg_buff": 1}, (TREE, SIMPLE), 3),
        ({"num_pipe_ops": 1, "reg_buff": 0}, (RING, SIMPLE), 5),
    ]
    for kwargs, chosen, channels in expectations:
        table = nccl_like_table()
        assert comm.coll_info(ALLREDUCE, 1024, table, **kwargs) == channels, kwargs
        assert table.nccl_choice() == chosen, kwargs


def test_v3_which_has_no_regbuff_matches_only_rows_for_any_regbuff(tuner: TunerLibrary, table_file: Path) -> None:
    table_file.write_text("allreduce,0,1048576,tree,simple,3,-1,-1,-1,1\nallreduce,0,1048576,ring,simple,5,-1,-1\n")
    comm = tuner.init(3, n_ranks=8, n_nodes=1)
    table = nccl_like_table()
    assert comm.coll_info(ALLREDUCE, 1024, table) == 5
    assert table.nccl_choice() == (RING, SIMPLE)


def test_an_algorithm_older_nccl_lacks_is_passed_over(tuner: TunerLibrary, table_file: Path) -> None:
    # NCCL 2.22 has no PAT and passes numAlgo = 6; PAT's cell must not be written past the table's end.
    table_file.write_text("allgather,0,1048576,pat,simple,4,-1,-1\n")
    comm = tuner.init(3, n_ranks=8, n_nodes=1)
    table = nccl_like_table(num_algo=6)
    before = table.snapshot()

    assert comm.coll_info(ALLGATHER, 1024, table) == 0
    assert table.snapshot() == before
    assert any("pat/simple, which this NCCL does not have" in m for m in comm.messages())
    assert PAT == 6


def test_applied_rows_are_logged_once_per_communicator(tuner: TunerLibrary, table_file: Path) -> None:
    table_file.write_text(TABLE)
    comm = tuner.init(5, n_ranks=8, n_nodes=1, comm_id=0xABCDEF)
    for _ in range(5):
        comm.coll_info(ALLREDUCE, 1024, nccl_like_table())

    applied = [m for m in comm.messages() if " applied: " in m]
    assert applied == [
        "TUNER/TopoTune: row at line 2 applied: allreduce of 1024 bytes -> ring/ll channels=16 "
        "(later matches logged at TRACE)"
    ]
    assert any("commId 0xabcdef" in m for m in comm.messages())
    # NCCL prints the file name on WARN lines; it must not be the temporary directory the build used.
    assert {r.file for r in comm.records} == {"topotune_tuner.c"}
    assert all(r.flags & 0x40 for r in comm.records), "every message belongs to NCCL's TUNING subsystem"
    assert sum("row at line 2 applied" in m for m in comm.messages(min_level=5)) == 5


def test_long_lines_and_overflowing_numbers(tuner: TunerLibrary, table_file: Path) -> None:
    table_file.write_text(
        "# " + "x" * 10000 + "\n"  # a comment far longer than any fixed line buffer
        "allreduce,0,99999999999999999999999,ring,simple,4,-1,-1\n"  # beyond 64 bits
        "allreduce,0,1024,ring,simple,4,-1,99999999999\n"  # nRanks beyond int
        "allreduce," + "1" * 5000 + ",1024,ring,simple,4,-1,-1\n"
        "allreduce,0,1024,ring,ll,3,-1,-1\n"
    )
    comm = tuner.init(5, n_ranks=8, n_nodes=1)
    warnings = [r.message for r in comm.records if r.level == LOG_WARN]

    assert [w.split(": ")[1].rsplit(":", 1)[1] for w in warnings] == ["2", "3", "4"]
    assert "max_bytes '99999999999999999999999'" in warnings[0]
    assert "nRanks '99999999999'" in warnings[1]
    table = nccl_like_table()
    assert comm.coll_info(ALLREDUCE, 100, table) == 3
    assert table.nccl_choice() == (RING, LL)


@pytest.mark.parametrize("version", [3, 5])
def test_a_keep_nccls_choice_row_sets_only_the_channel_count(
    tuner: TunerLibrary, table_file: Path, version: int
) -> None:
    # -1,-1: NCCL keeps choosing the algorithm/protocol; the row only sets channels (per size bucket).
    table_file.write_text("allreduce,0,65536,-1,-1,16,-1,-1\nallreduce,65537,1073741824,-1,-1,4,-1,-1\n")
    comm = tuner.init(version, n_ranks=2, n_nodes=1)
    for n_bytes, channels in ((4 * KIB, 16), (256 * MIB, 4)):
        table = nccl_like_table()
        before = table.snapshot()
        assert comm.coll_info(ALLREDUCE, n_bytes, table) == channels
        assert table.snapshot() == before, "no cost entry may change"
    applied = "line 1 applied: allreduce of 4096 bytes -> NCCL's algorithm/protocol, channels=16"
    assert any(applied in m for m in comm.messages())


def test_keep_nccls_choice_needs_both_algorithm_and_protocol(tuner: TunerLibrary, table_file: Path) -> None:
    table_file.write_text("allreduce,0,65536,-1,simple,16,-1,-1\nallreduce,0,65536,ring,-1,16,-1,-1\n")
    comm = tuner.init(5, n_ranks=2, n_nodes=1)
    warnings = [r.message for r in comm.records if r.level == LOG_WARN]
    assert len(warnings) == 2
    assert all("-1 (keep NCCL's) must be given for both" in w for w in warnings)
