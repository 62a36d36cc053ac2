"""PyTorch profiler traces (Chrome trace JSON, ``.json`` or ``.json.gz``): the collectives of one rank.

Each call is counted once, from the row its process group writes:

- ``ProcessGroupNCCL`` writes one ``record_param_comms`` CPU op per call, with ``Collective name``,
  ``In msg nelems``, ``Out msg nelems``, ``Group size`` and ``dtype``; the GPU kernel it launched carries the
  same fields, with the kernel's duration (only when CUDA activity was profiled).
- ``ProcessGroupGloo`` writes no such row; its work runs under a ``gloo:<collective>`` annotation with
  ``Input Dims``, ``Input type`` and the work's duration.

A trace with ``record_param_comms`` rows is a job on NCCL: its calls are those rows, and any
``gloo:*`` annotations beside them (a CPU process group NCCL's settings never touch) are listed as skipped.
A trace without any is a gloo job, counted from its annotations. Sizes follow nccl-tests (``calls``):
all_gather counts its output (every rank's part), reduce_scatter its input, the others their input.

Non-goals: ``torch.profiler``'s execution traces (``ExecutionTraceObserver``), and timing of any kind
beyond what the trace recorded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from topo_tune.errors import WorkloadFileError
from topo_tune.nccl.collectives import Collective
from topo_tune.workload.calls import CallStats, FileCalls
from topo_tune.workload.collective_names import collective_named
from topo_tune.workload.json_stream import DEFAULT_LIMITS, JsonStream, Limits, open_text

__all__ = ["ELEMENT_BYTES", "read_torch_trace"]

ELEMENT_BYTES: Final[Mapping[str, int]] = {
    # record_param_comms spells c10's ScalarType names, gloo's "Input type" C++ type names; lower-cased.
    **dict.fromkeys(("byte", "unsigned char", "uint8", "char", "signed char", "int8", "bool"), 1),
    **dict.fromkeys(("float8_e4m3fn", "float8_e5m2", "c10::float8_e4m3fn", "c10::float8_e5m2"), 1),
    **dict.fromkeys(("half", "c10::half", "float16", "bfloat16", "c10::bfloat16", "short", "short int", "int16"), 2),
    **dict.fromkeys(("float", "float32", "int", "int32", "complexhalf", "c10::complex<c10::half>"), 4),
    **dict.fromkeys(("double", "float64", "long", "long int", "int64", "complexfloat", "c10::complex<float>"), 8),
    **dict.fromkeys(("complexdouble", "c10::complex<double>"), 16),
}

_NON_EVENT_KEYS_KEPT = ("distributedInfo",)


def read_torch_trace(path: Path, *, limits: Limits = DEFAULT_LIMITS) -> FileCalls:
    """The calls of the rank that wrote ``path``; :class:`~topo_tune.errors.WorkloadFileError` on bad input."""
    source = str(path)
    nccl_rows: list[dict[str, Any]] = []
    kernel_time: dict[tuple[str, int], list[float]] = {}
    gloo_rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    saw_events = False
    with open_text(path) as text:
        stream = JsonStream(text, source=source, limits=limits)
        if stream.peek() != "{":
            raise stream.error("not a PyTorch profiler trace (a JSON object with traceEvents)")
        for key in stream.object_keys():
            if key != "traceEvents":
                value = stream.value()
                if key in _NON_EVENT_KEYS_KEPT and isinstance(value, dict):
                    info[key] = value
                continue
            saw_events = True
            for event in stream.array_items():
                if not isinstance(event, dict) or event.get("ph") != "X":
                    continue
                name = event.get("name")
                args = event.get("args")
                if not isinstance(name, str) or not isinstance(args, dict):
                    continue
                if name == "record_param_comms" and event.get("cat") == "cpu_op":
                    nccl_rows.append(args)
                elif event.get("cat") == "kernel" and "Collective name" in args:
                    key_ = _kernel_key(args)
                    if key_ is not None:
                        kernel_time.setdefault(key_, []).append(_duration(event))
                elif name.startswith("gloo:") and event.get("cat") == "user_annotation":
                    gloo_rows.append({**args, "name": name[len("gloo:") :], "dur": event.get("dur")})
        if not stream.at_end():
            raise stream.error("malformed JSON: text after the trace's object")
    if not saw_events:
        raise WorkloadFileError(source, "not a PyTorch profiler trace: no traceEvents")
    distributed = info.get("distributedInfo", {})
    rank = distributed.get("rank") if isinstance(distributed.get("rank"), int) else None
    world = distributed.get("world_size") if isinstance(distributed.get("world_size"), int) else None
    out = FileCalls(source=source, kind="pytorch-trace", rank=rank)
    if nccl_rows:
        _count_nccl(out, nccl_rows, kernel_time)
        for row in gloo_rows:
            out.skipped[f"gloo:{row['name']} (a gloo process group beside NCCL)"] += 1
    else:
        _count_gloo(out, gloo_rows, world)
    return out


def _duration(event: Mapping[str, Any]) -> float:
    dur = event.get("dur")
    return float(dur) if isinstance(dur, int | float) and math.isfinite(dur) and dur >= 0 else math.nan


def _int(args: Mapping[str, Any], key: str) -> int | None:
    value = args.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _nccl_bytes(collective: Collective, args: Mapping[str, Any]) -> int | None:
    element = ELEMENT_BYTES.get(str(args.get("dtype", "")).lower())
    n_in, n_out, group = _int(args, "In msg nelems"), _int(args, "Out msg nelems"), _int(args, "Group size")
    if element is None or n_in is None:
        return None
    if collective is Collective.ALL_GATHER:
        if n_out:
            return n_out * element
        return n_in * (group or 1) * element
    return n_in * element


def _kernel_key(args: Mapping[str, Any]) -> tuple[str, int] | None:
    name = str(args.get("Collective name", ""))
    collective = collective_named(name)
    if collective is None:
        return None
    size = _nccl_bytes(collective, args)
    return None if size is None else (collective.value, size)


def _count_nccl(out: FileCalls, rows: list[dict[str, Any]], kernel_time: Mapping[tuple[str, int], list[float]]) -> None:
    pending: dict[tuple[Collective, int], int] = {}
    for args in rows:
        name = str(args.get("Collective name", ""))
        collective = collective_named(name)
        if collective is None:
            out.skipped[name or "(no Collective name)"] += 1
            continue
        size = _nccl_bytes(collective, args)
        if size is None:
            out.skipped[f"{name} (dtype {args.get('dtype')!r} or sizes unreadable)"] += 1
            continue
        pending[(collective, size)] = pending.get((collective, size), 0) + 1
    for (collective, size), calls in pending.items():
        times = [t for t in kernel_time.get((collective.value, size), []) if not math.isnan(t)]
        stats = out.calls.setdefault((collective, size), CallStats())
        if len(times) >= calls:
            # One kernel per call; a profiler window may cut kernels whose CPU op it saw, so only a full set counts.
            stats.add(sum(times[:calls]), calls)
        else:
            stats.add(None, calls)


def _count_gloo(out: FileCalls, rows: list[dict[str, Any]], world: int | None) -> None:
    for row in rows:
        name = str(row["name"])
        collective = collective_named(name)
        if collective is None:
            out.skipped[f"gloo:{name}"] += 1
            continue
        types = row.get("Input type")
        dims = row.get("Input Dims")
        element = ELEMENT_BYTES.get(str(types[0]).lower()) if isinstance(types, list) and types else None
        elements = _elements(dims)
        if element is None or elements is None:
            out.skipped[f"gloo:{name} (input type or dims unreadable)"] += 1
            continue
        size = elements * element
        if collective is Collective.ALL_GATHER:
            if world is None:
                out.skipped[f"gloo:{name} (no world size in the trace's distributedInfo)"] += 1
                continue
            size *= world
        duration = _duration(row)
        out.add(collective, size, duration_us=None if math.isnan(duration) else duration)


def _elements(dims: object) -> int | None:
    """Elements of every tensor in ``Input Dims`` (a list of shapes, each a list of ints)."""
    if not isinstance(dims, list) or not dims:
        return None
    total = 0
    for shape in dims:
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        total += math.prod(shape)
    return total
