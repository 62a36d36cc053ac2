"""An nccl-tests-style text table, column for column, so users can diff the two outputs.

The row and header formats, the float formatting (``getFloatStr``) and the footer are those of
NVIDIA nccl-tests ``src/util.cu`` (``writeResultHeader``, ``writeBenchmarkLinePreamble``,
``writeBenchmarkLineBody``, ``writeResultFooter``). A half that was not run prints ``N/A`` in
each of its columns so that the columns still line up. A simulated result says so in a comment
line above the table.

Non-goals: JSON output (the admin CLI renders the proto), aggregation over ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from topo_tune.benchmark.dtypes import DType
from topo_tune.benchmark.results import SizeMeasurement
from topo_tune.nccl.collectives import Collective

__all__ = ["TableContext", "format_float", "render_table"]


def format_float(value: float, width: int) -> str:
    """nccl-tests' ``getFloatStr``: 2, 1 or 0 decimals depending on magnitude, else exponent."""
    power = 0
    if math.isfinite(value):
        threshold = 1
        while value >= threshold:
            power += 1
            threshold *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def _c_g(value: float) -> str:
    """C's ``%g`` (Python's ``g`` matches it for the integers we print)."""
    return f"{value:g}"


@dataclass(frozen=True, slots=True)
class TableContext:
    collective: Collective
    dtype: DType
    nranks: int
    min_bytes: int
    max_bytes: int
    step_factor: int
    warmup_iters: int
    iters: int
    check: bool
    simulated: bool = False
    cuda_graph: bool = False


_HALF_NA = f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"


def _half(m: SizeMeasurement | None) -> str:
    if m is None:
        return _HALF_NA
    body = f"  {format_float(m.time_us, 7)}  {format_float(m.algbw_gbps, 6)}  {format_float(m.busbw_gbps, 6)}"
    return body + (f"  {_c_g(float(m.wrong)):>6}" if m.checked else "    N/A")


def render_table(ctx: TableContext, sizes: Iterable[SizeMeasurement]) -> str:
    """The table for one collective's sweep (one rank's or the aggregated measurements)."""
    rows: dict[int, dict[bool, SizeMeasurement]] = {}
    counts: dict[int, int] = {}
    for m in sizes:
        rows.setdefault(m.bytes, {})[m.in_place] = m
        counts[m.bytes] = m.count
    lines = []
    if ctx.simulated:
        lines.append("# SIMULATED: figures from topo-tune's analytic model, not a measurement")
    lines.append(f"# topo-tune benchmark: {ctx.collective.value}_perf")
    lines.append(
        f"# nRanks {ctx.nranks} minBytes {ctx.min_bytes} maxBytes {ctx.max_bytes} "
        f"step: {ctx.step_factor}(factor) warmup iters: {ctx.warmup_iters} iters: {ctx.iters} "
        f"agg iters: 1 validation: {int(ctx.check)} graph: {int(ctx.cuda_graph)}"
    )
    lines.append("#")
    lines.append(
        f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}"
        "           out-of-place                       in-place          "
    )
    lines.append(
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
        f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}"
        f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6} "
    )
    lines.append(
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
        f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}"
        f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6} "
    )
    wrong_sizes = 0
    busbw: list[float] = []
    for size in sorted(rows):
        halves = rows[size]
        preamble = (
            f"{size:12d}  {counts[size]:12d}  {ctx.dtype.nccl_tests_name:>8}"
            f"  {ctx.collective.redop_name:>6}  {ctx.collective.root:6d}"
        )
        lines.append(preamble + _half(halves.get(False)) + _half(halves.get(True)))
        for m in halves.values():
            busbw.append(m.busbw_gbps)
            wrong_sizes += int(m.checked and m.wrong > 0)
    avg = sum(busbw) / len(busbw) if busbw else 0.0
    lines.append(f"# {'Out of bounds values':<20} : {wrong_sizes} {'FAILED' if wrong_sizes else 'OK'}")
    lines.append(f"# {'Avg bus bandwidth':<20} : {_c_g(avg)} ")
    lines.append("#")
    return "\n".join(lines) + "\n"
