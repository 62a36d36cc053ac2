"""The tuner plugin's call counts (``TOPO_TUNE_WORKLOAD_DIR``), written at finalize, one file per communicator.

The file is text::

    topo-tune workload record 1
    process <host>:<pid> nranks <n> nnodes <n>
    <collective> <max bytes of the size class> <calls> <bytes>
    ...

A size class holds the sizes in ``(max/2, max]``, so it never straddles a tuner bucket (their upper ends are
powers of two). Counts are what NCCL passed to the plugin's ``getCollInfo``, which is fewer than the job's
calls in two cases (NCCL's ``src/enqueue.cc``): collectives launched in one group with the same function,
data type and reduction op and within 4x of each other's size are aggregated into one ``getCollInfo`` call at
their summed size, and a CUDA graph's replays call nothing (the plugin sees the one capture). The import
therefore says that these counts are lower bounds.

Non-goals: the plugin's tuning table and its decision record (``topo_tune.plugin.record``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from topo_tune.errors import WorkloadFileError
from topo_tune.workload.calls import FileCalls
from topo_tune.workload.collective_names import collective_named
from topo_tune.workload.json_stream import DEFAULT_LIMITS, Limits, open_text

__all__ = ["LOWER_BOUND", "MAGIC", "read_plugin_record"]

MAGIC: Final = "topo-tune workload record 1\n"
LOWER_BOUND: Final = (
    "the tuner plugin sees one call per group of merged collectives (same function, type and op within 4x "
    "in size) and none on CUDA graph replay"
)
_MAX_LINES = 100_000


def read_plugin_record(path: Path, *, limits: Limits = DEFAULT_LIMITS) -> FileCalls:
    """The counts in ``path``; :class:`~topo_tune.errors.WorkloadFileError` naming the line on bad input."""
    source = str(path)
    out = FileCalls(source=source, kind="plugin-record", lower_bound=LOWER_BOUND)

    def bad(line: int, reason: str) -> WorkloadFileError:
        return WorkloadFileError(f"{source}:{line}", reason)

    with open_text(path) as text:
        if text.read(len(MAGIC)) != MAGIC:
            raise WorkloadFileError(source, "not a topo-tune plugin workload record")
        number = 1
        for number, line in enumerate(text, start=2):
            if number > _MAX_LINES or len(line) > min(limits.max_value_chars, 4096):
                raise bad(number, "too long: a plugin record has one short line per size class")
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if fields[0] == "process":
                if len(fields) < 2:
                    raise bad(number, "process line without its host:pid")
                out.process = fields[1]
                ranks = fields.index("nranks") + 1 if "nranks" in fields else 0
                if 0 < ranks < len(fields) and fields[ranks].isdigit():
                    out.communicator_ranks = int(fields[ranks])
                continue
            if len(fields) != 4 or not all(f.isdigit() for f in fields[1:]):
                raise bad(number, "expected '<collective> <class max bytes> <calls> <bytes>'")
            name, top, calls, moved = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
            collective = collective_named(name)
            if collective is None:
                out.skipped[name] += calls
                continue
            if calls == 0:
                continue
            mean = moved // calls
            if not top // 2 < max(mean, 1) <= top and not (top == 0 and mean == 0):
                raise bad(number, f"{moved} bytes over {calls} calls is not in the size class up to {top} bytes")
            out.add(collective, mean, duration_us=None, calls=calls)
        if number == 1:
            raise WorkloadFileError(source, "truncated: no process line")
    return out
