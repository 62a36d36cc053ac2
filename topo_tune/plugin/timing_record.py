"""The profiler's timing record (``topo-tune-timing.*.txt``), as Python reads it: strict, one line per error.

With ``TOPO_TUNE_WORKLOAD_DIR`` and ``TOPO_TUNE_TIMING_SAMPLE`` set, ``topotune_profiler.c`` writes one file
per communicator at finalize::

    topo-tune timing record 1
    process <host>:<pid> comm <commId hex> rank <r> nranks <n> nnodes <n> sample <K> arm <arm | ->
    unfinished <n> overflow <n>
    <collective> <class max bytes> <algorithm>/<protocol> <calls> <timed> <sum ns> <min ns> <max ns> <sum ln ns>
      <sum ln^2 ns>

Non-goals: writing it (the plugin does) and comparing records (``topo_tune.learning.evidence``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from topo_tune.errors import RecordError

__all__ = [
    "MAX_CALL_BYTES",
    "MAX_RECORDS_PER_CALL",
    "MAX_TIMING_BYTES",
    "TIMING_FILES",
    "TIMING_MAGIC",
    "TimingCell",
    "TimingRecord",
    "parse_timing_record",
]

TIMING_MAGIC = "topo-tune timing record 1"
TIMING_FILES = "topo-tune-timing.*.txt"
"""The profiler's records in a job's workload directory (``topotune_profiler.c``: topo-tune-timing.HOST.PID.N.txt)."""
MAX_TIMING_BYTES = 1024 * 1024
"""A record larger than this is refused: a communicator writes at most one line per (collective, class, way)."""
MAX_RECORDS_PER_CALL = 512
"""Records one call to the controller may carry (a node's ranks times their communicators); more go in more calls."""
MAX_CALL_BYTES = 8 * 1024 * 1024
"""Bytes of record text one call to the controller may carry, all records together."""

_COLLECTIVES = frozenset({"broadcast", "reduce", "allgather", "reducescatter", "allreduce", "other_function"})
_HEAD_KEYS = ("process", "comm", "rank", "nranks", "nnodes", "sample", "arm")


@dataclass(frozen=True, slots=True)
class TimingCell:
    """One (collective, size class, choice) of one communicator on one rank."""

    collective: str
    class_bytes: int
    """The size class's largest size: it holds (class_bytes / 2, class_bytes]."""
    choice: str
    """What NCCL launched, ``algorithm/protocol`` in the plugin's names."""
    calls: int
    timed: int
    sum_ns: int
    min_ns: int
    max_ns: int
    sum_log: float
    sum_sq_log: float

    @property
    def mean_log(self) -> float | None:
        """The mean of ln(ns) over the timed calls; None when none was timed."""
        return self.sum_log / self.timed if self.timed else None


@dataclass(frozen=True, slots=True)
class TimingRecord:
    """One communicator's record on one rank."""

    process: str
    comm: int
    rank: int
    n_ranks: int
    n_nodes: int
    sample: int
    arm: int | None
    """The job's arm (``TOPO_TUNE_LEARNING_ARM``); None when the job named none."""
    unfinished: int
    overflow: int
    cells: tuple[TimingCell, ...]


def _head(line: str, source: str) -> dict[str, str]:
    words = line.split()
    keys, values = words[0::2], words[1::2]
    if tuple(keys) != _HEAD_KEYS or len(values) != len(keys):
        raise RecordError(f"{source}:2: expected '{' <v> '.join(_HEAD_KEYS)} <v>', got {line[:120]!r}")
    return dict(zip(keys, values, strict=True))


def _cell(line: str, number: int, source: str) -> TimingCell:
    f = line.split()
    if len(f) != 10 or f[0] not in _COLLECTIVES or f[2].count("/") != 1:
        raise RecordError(f"{source}:{number}: expected '<collective> <bytes> <algo>/<proto>' and 7 numbers")
    try:
        counts = [int(v) for v in f[3:8]]
        logs = float(f[8]), float(f[9])
        class_bytes = int(f[1])
    except ValueError:
        raise RecordError(f"{source}:{number}: counts must be integers and log sums numbers") from None
    if min(counts) < 0 or class_bytes < 1 or counts[1] > counts[0] or not all(map(math.isfinite, logs)):
        raise RecordError(f"{source}:{number}: negative or inconsistent counts (timed may not exceed calls)")
    calls, timed, sum_ns, min_ns, max_ns = counts
    return TimingCell(f[0], class_bytes, f[2], calls, timed, sum_ns, min_ns, max_ns, logs[0], logs[1])


def parse_timing_record(text: str, *, source: str = "timing record") -> TimingRecord:
    """The record of ``text``.

    Raises:
        RecordError: too large, or a malformed line (``source:LINE: why``).
    """
    if len(text) > MAX_TIMING_BYTES:
        raise RecordError(f"{source}: {len(text)} bytes, more than the {MAX_TIMING_BYTES} a timing record may hold")
    lines = text.splitlines()
    if not lines or lines[0] != TIMING_MAGIC:
        raise RecordError(f"{source}:1: not a timing record (expected {TIMING_MAGIC!r})")
    if len(lines) < 3:
        raise RecordError(f"{source}: ends before its 'unfinished' line")
    head = _head(lines[1], source)
    tail = lines[2].split()
    try:
        comm = int(head["comm"], 16)
        numbers = [int(head[k]) for k in ("rank", "nranks", "nnodes", "sample")]
        arm = None if head["arm"] == "-" else int(head["arm"])
        if tail[0::2] != ["unfinished", "overflow"] or len(tail) != 4:
            raise ValueError
        unfinished, overflow = int(tail[1]), int(tail[3])
    except ValueError:
        raise RecordError(f"{source}: comm must be hex, the other header values whole numbers") from None
    cells = tuple(_cell(line, n, source) for n, line in enumerate(lines[3:], start=4) if line.strip())
    rank, n_ranks, n_nodes, sample = numbers
    return TimingRecord(head["process"], comm, rank, n_ranks, n_nodes, sample, arm, unfinished, overflow, cells)
