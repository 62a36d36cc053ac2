"""Which reader a workload file needs, told from its first bytes, not its name.

A PyTorch trace is one JSON object whose first keys are the profiler's (``schemaVersion``,
``deviceProperties``, ``traceEvents``...); an NCCL Inspector log starts with a record holding ``header``;
a tuner plugin record starts with its own first line (``plugin_record.MAGIC``).

Non-goal: reading the files (each reader does, and bounds its input itself).
"""

from __future__ import annotations

from pathlib import Path

from topo_tune.errors import WorkloadFileError
from topo_tune.workload.calls import FileCalls
from topo_tune.workload.inspector_log import read_inspector_log
from topo_tune.workload.json_stream import DEFAULT_LIMITS, Limits, open_text
from topo_tune.workload.plugin_record import MAGIC, read_plugin_record
from topo_tune.workload.torch_trace import read_torch_trace

__all__ = ["read_workload_file"]

_SNIFF_CHARS = 1 << 16
_TRACE_KEYS = ('"traceEvents"', '"schemaVersion"', '"deviceProperties"', '"distributedInfo"')


def read_workload_file(path: Path, *, limits: Limits = DEFAULT_LIMITS) -> FileCalls:
    """The calls in ``path``, whichever of the three kinds it is."""
    with open_text(path) as text:
        head = text.read(_SNIFF_CHARS)
    if head.startswith(MAGIC):
        return read_plugin_record(path, limits=limits)
    stripped = head.lstrip()
    if stripped.startswith("{") and any(key in head for key in _TRACE_KEYS):
        return read_torch_trace(path, limits=limits)
    if stripped.startswith("{") and '"header"' in head:
        return read_inspector_log(path, limits=limits)
    if not stripped:
        raise WorkloadFileError(str(path), "empty")
    raise WorkloadFileError(
        str(path), "not a PyTorch profiler trace, an NCCL Inspector log or a topo-tune plugin record"
    )
