"""The profiler's timing record as Python reads it: what the plugin writes parses, anything else is one error."""

from __future__ import annotations

import pytest

from topo_tune.errors import RecordError
from topo_tune.plugin.timing_record import MAX_TIMING_BYTES, parse_timing_record

GOOD = """topo-tune timing record 1
process node-3:4242 comm abc rank 1 nranks 2 nnodes 1 sample 3 arm 2
unfinished 0 overflow 0
allgather 1048576 ring/simple 6 2 160060 80030 80030 22.5803137 254.935283
allreduce 1024 ring/ll 6 2 10020 5010 5010 17.0383824 145.153237
"""


def test_a_record_as_the_plugin_writes_it_parses() -> None:
    record = parse_timing_record(GOOD)
    assert (record.process, record.comm, record.rank, record.n_ranks, record.sample, record.arm) == (
        "node-3:4242",
        0xABC,
        1,
        2,
        3,
        2,
    )
    allgather, allreduce = record.cells
    assert (allgather.class_bytes, allgather.timed, allgather.sum_ns) == (1 << 20, 2, 160060)
    assert (allreduce.collective, allreduce.class_bytes, allreduce.choice, allreduce.calls) == (
        "allreduce",
        1024,
        "ring/ll",
        6,
    )
    assert allreduce.mean_log == pytest.approx(17.0383824 / 2)
    assert parse_timing_record(GOOD.replace("arm 2", "arm -")).arm is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("nonsense\n", "timing record:1: not a timing record"),
        (GOOD.replace("comm abc", "comm xyz"), "comm must be hex"),
        (GOOD.replace(" nnodes 1", ""), "timing record:2: expected"),
        (GOOD.replace("unfinished 0", "unfinished x"), "whole numbers"),
        (GOOD.replace("allreduce 1024", "alltoall 1024"), "timing record:5: expected"),
        (GOOD.replace("ring/ll 6 2", "ring/ll 6 7"), "timing record:5: negative or inconsistent"),
        (GOOD.replace("145.153237", "nan"), "timing record:5: negative or inconsistent"),
        (GOOD.replace("10020", "1.5"), "timing record:5: counts must be integers"),
        ("topo-tune timing record 1\n", "ends before"),
        ("x" * (MAX_TIMING_BYTES + 1), "more than the"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_line(text: str, words: str) -> None:
    with pytest.raises(RecordError, match=words):
        parse_timing_record(text)
