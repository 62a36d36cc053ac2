"""The nccl-tests-style table lines up with nccl-tests' own printf formats."""

# The expected lines are built with C-style % formats on purpose: they are nccl-tests' printf calls.
# ruff: noqa: UP031

from __future__ import annotations

import dataclasses

from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.results import SizeMeasurement
from topo_tune.benchmark.table import TableContext, format_float, render_table
from topo_tune.nccl.collectives import Collective


def _c_get_float_str(value: float, width: int) -> str:
    """nccl-tests src/util.cu getFloatStr, transcribed with C printf formats."""
    power = 0
    val = 1
    while value >= val:
        power += 1
        val *= 10
    if power < width - 2:
        return "%*.2f" % (width, value)
    if power < width - 1:
        return "%*.1f" % (width, value)
    if power < width + 1:
        return "%*.0f" % (width, value)
    if width >= 7:
        return "%*.1e" % (width, value)
    return "%*.0e" % (width, value)


def _m(
    size: int, count: int, *, in_place: bool, time_us: float, wrong: int = 0, checked: bool = True
) -> SizeMeasurement:
    return SizeMeasurement(
        size,
        count,
        in_place,
        time_us,
        size / time_us / 1e3,
        size / time_us / 1e3 * 1.75,
        wrong,
        checked,
        time_us,
        time_us,
        0.01,
    )


def test_float_columns_match_get_float_str() -> None:
    for value in (0.0, 0.004, 1.5, 99.999, 1234.567, 12345.6, 123456.0, 9999999.0, 1.0e9):
        for width in (6, 7):
            assert format_float(value, width) == _c_get_float_str(value, width)


def test_rows_and_headers_line_up_with_nccl_tests_printf() -> None:
    ctx = TableContext(Collective.ALL_REDUCE, dtype_named("float32"), 8, 8, 1 << 30, 2, 5, 20, True)
    rows = [
        _m(8, 2, in_place=False, time_us=19.42),
        _m(8, 2, in_place=True, time_us=18.9),
        _m(1 << 30, 1 << 28, in_place=False, time_us=3452.1, wrong=3),
        _m(1 << 30, 1 << 28, in_place=True, time_us=3449.0),
    ]
    lines = render_table(ctx, rows).splitlines()
    header = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s" % (
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        0,
        "",
    )
    assert header in lines
    first = next(line for line in lines if not line.startswith("#"))
    m_out, m_in = rows[0], rows[1]
    expected = "%12li  %12li  %8s  %6s  %6s" % (8, 2, "float", "sum", "%6i" % -1)
    for m in (m_out, m_in):
        expected += "  %7s  %6s  %6s  %6g" % (
            _c_get_float_str(m.time_us, 7),
            _c_get_float_str(m.algbw_gbps, 6),
            _c_get_float_str(m.busbw_gbps, 6),
            float(m.wrong),
        )
    assert first == expected
    assert "# Out of bounds values : 1 FAILED" in lines
    # nccl-tests' parameter line ends "agg iters: 1 validation: 1 graph: 0"; -G shows as graph: 1.
    assert lines[1].endswith("warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0")
    graphed = render_table(dataclasses.replace(ctx, cuda_graph=True), rows).splitlines()
    assert graphed[1].endswith("validation: 1 graph: 1")


def test_missing_and_unchecked_halves_keep_the_columns() -> None:
    ctx = TableContext(Collective.ALLTOALL, dtype_named("bfloat16"), 2, 1024, 1024, 2, 1, 5, False, simulated=True)
    text = render_table(ctx, [_m(1024, 256, in_place=False, time_us=10.0, checked=False)])
    row = next(line for line in text.splitlines() if not line.startswith("#"))
    header = next(line for line in text.splitlines() if "#wrong" in line)
    # The header keeps nccl-tests' trailing space, and an unchecked "#wrong" prints nccl-tests'
    # "    N/A", one character narrower than "  %6g".
    assert len(row) == len(header) - 2
    assert row.count("N/A") == 5  # unchecked #wrong, then the in-place half that did not run
    assert "bfloat16" in row and "  none  " in row
    assert text.startswith("# SIMULATED")
