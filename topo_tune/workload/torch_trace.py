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

Events are added up per (collective, size) while they are read, nothing is kept per event, so memory does
not grow with the number of events; a duration that is not a finite number is an error naming the event.

Non-goals: ``torch.profiler``'s execution traces (``ExecutionTraceObserver``), and timing of any kind
beyond what the trace recorded.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    tally = _Tally()
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
            for index, event in enumerate(stream.array_items(name="traceEvents")):
                try:
                    tally.add(event)
                except _BadEvent as error:
                    raise stream.error(f"traceEvents[{index}]: {error}") from None
        if not stream.at_end():
            raise stream.error("malformed JSON: text after the trace's object")
    if not saw_events:
        raise WorkloadFileError(source, "not a PyTorch profiler trace: no traceEvents")
    distributed = info.get("distributedInfo", {})
    rank = distributed.get("rank") if isinstance(distributed.get("rank"), int) else None
    world = distributed.get("world_size") if isinstance(distributed.get("world_size"), int) else None
    out = FileCalls(source=source, kind="pytorch-trace", rank=rank)
    if tally.nccl_calls or tally.nccl_skipped:
        tally.count_nccl(out)
        for name, calls in tally.gloo_names.items():
            out.skipped[f"gloo:{name} (a gloo process group beside NCCL)"] += calls
    else:
        tally.count_gloo(out, world)
    return out


class _BadEvent(ValueError):
    """An event whose fields cannot be true (a duration that is not a finite number); the reader names it."""


@dataclass
class _Tally:
    """A trace's events added up while they are read: per (collective, size), never per event, so memory
    grows with the distinct sizes a job calls, not with the number of its calls."""

    nccl_calls: dict[tuple[Collective, int], int] = field(default_factory=dict)
    nccl_skipped: Counter[str] = field(default_factory=Counter)
    kernels: dict[tuple[str, int], _KernelTimes] = field(default_factory=dict)
    gloo: dict[tuple[str, Collective, int], CallStats] = field(default_factory=dict)
    """gloo calls by (name, collective, bytes of one rank's input); all_gather's are multiplied by the world
    size at the end, since ``distributedInfo`` may follow ``traceEvents`` in the file."""
    gloo_skipped: Counter[str] = field(default_factory=Counter)
    gloo_names: Counter[str] = field(default_factory=Counter)

    def add(self, event: object) -> None:
        if not isinstance(event, dict) or event.get("ph") != "X":
            return
        name = event.get("name")
        args = event.get("args")
        if not isinstance(name, str) or not isinstance(args, dict):
            return
        if name == "record_param_comms" and event.get("cat") == "cpu_op":
            self._add_nccl(args)
        elif event.get("cat") == "kernel" and "Collective name" in args:
            key = _kernel_key(args)
            if key is not None:
                self.kernels.setdefault(key, _KernelTimes()).add(_duration(event))
        elif name.startswith("gloo:") and event.get("cat") == "user_annotation":
            self._add_gloo(name[len("gloo:") :], args, _duration(event))

    def _add_nccl(self, args: Mapping[str, Any]) -> None:
        name = str(args.get("Collective name", ""))
        collective = collective_named(name)
        if collective is None:
            self.nccl_skipped[name or "(no Collective name)"] += 1
            return
        size = _nccl_bytes(collective, args)
        if size is None:
            self.nccl_skipped[f"{name} (dtype {args.get('dtype')!r} or sizes unreadable)"] += 1
            return
        self.nccl_calls[(collective, size)] = self.nccl_calls.get((collective, size), 0) + 1

    def _add_gloo(self, name: str, args: Mapping[str, Any], duration: float) -> None:
        self.gloo_names[name] += 1
        collective = collective_named(name)
        if collective is None:
            self.gloo_skipped[f"gloo:{name}"] += 1
            return
        types = args.get("Input type")
        element = ELEMENT_BYTES.get(str(types[0]).lower()) if isinstance(types, list) and types else None
        elements = _elements(args.get("Input Dims"))
        if element is None or elements is None:
            self.gloo_skipped[f"gloo:{name} (input type or dims unreadable)"] += 1
            return
        stats = self.gloo.setdefault((name, collective, elements * element), CallStats())
        stats.add(None if math.isnan(duration) else duration)

    def count_nccl(self, out: FileCalls) -> None:
        out.skipped.update(self.nccl_skipped)
        for (collective, size), calls in self.nccl_calls.items():
            kernels = self.kernels.get((collective.value, size))
            stats = out.calls.setdefault((collective, size), CallStats())
            # One kernel per call; a profiler window may cut kernels whose CPU op it saw, so only a full set
            # counts. One that holds kernels of CPU ops before the window counts the calls at their mean.
            if kernels is not None and kernels.timed >= calls:
                time_us = kernels.time_us if kernels.timed == calls else kernels.time_us * calls / kernels.timed
                stats.add(time_us, calls)
            else:
                stats.add(None, calls)

    def count_gloo(self, out: FileCalls, world: int | None) -> None:
        out.skipped.update(self.gloo_skipped)
        for (name, collective, part), stats in self.gloo.items():
            size = part
            if collective is Collective.ALL_GATHER:
                if world is None:
                    out.skipped[f"gloo:{name} (no world size in the trace's distributedInfo)"] += int(stats.calls)
                    continue
                size = part * world
            merged = out.calls.setdefault((collective, size), CallStats())
            merged.calls += stats.calls
            merged.timed_calls += stats.timed_calls
            merged.time_us += stats.time_us


@dataclass(slots=True)
class _KernelTimes:
    """The NCCL kernels of one (collective, size): how many carried a duration, and their total."""

    timed: int = 0
    time_us: float = 0.0

    def add(self, duration: float) -> None:
        if not math.isnan(duration):
            self.timed += 1
            self.time_us += duration


def _duration(event: Mapping[str, Any]) -> float:
    """The event's duration in µs; NaN when it has none (or a negative one): the call then counts untimed."""
    dur = event.get("dur")
    if not isinstance(dur, int | float) or isinstance(dur, bool):
        return math.nan
    if isinstance(dur, float) and not math.isfinite(dur):
        raise _BadEvent(f"dur is {dur}, not a finite number of microseconds")
    return float(dur) if dur >= 0 else math.nan


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
