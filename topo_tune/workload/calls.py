"""What one imported file says a job did: calls per (collective, size), per rank, and what was skipped.

Every reader (``torch_trace``, ``inspector_log``, ``plugin_record``) returns a :class:`FileCalls`;
:func:`per_rank` combines the files of one import into a :class:`JobCalls`, the per-rank figures the
weights are computed from. Sizes are the bytes NCCL moves in nccl-tests' convention (the ``size`` column of
``*_perf``: all_gather and reduce_scatter count the full buffer, ``n`` times one rank's part), which is also
the ``nBytes`` NCCL hands the tuner plugin, so they fall into the buckets the tuner measures.

Non-goals: reading files, and weighing buckets (``weights``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from topo_tune.errors import WorkloadFileError
from topo_tune.nccl.collectives import Collective

__all__ = ["CallStats", "FileCalls", "JobCalls", "Kind", "per_rank"]

Kind = Literal["pytorch-trace", "nccl-inspector", "plugin-record"]

KIND_LABELS: Mapping[Kind, str] = {
    "pytorch-trace": "PyTorch profiler trace",
    "nccl-inspector": "NCCL Inspector log",
    "plugin-record": "topo-tune tuner plugin record",
}


@dataclass(slots=True)
class CallStats:
    """Calls of one (collective, size): how many, and the time of those that carried a duration."""

    calls: float = 0.0
    timed_calls: float = 0.0
    time_us: float = 0.0

    def add(self, duration_us: float | None, calls: float = 1.0) -> None:
        self.calls += calls
        if duration_us is not None:
            self.timed_calls += calls
            self.time_us += duration_us


@dataclass
class FileCalls:
    """One file's calls (one rank's), keyed by (collective, bytes)."""

    source: str
    kind: Kind
    rank: int | None = None
    calls: dict[tuple[Collective, int], CallStats] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    lower_bound: str | None = None
    """Why the counts may be lower than the job's calls, when they may."""
    process: str | None = None
    """The process that wrote it when one process writes several files (one per communicator)."""
    communicator_ranks: int | None = None
    """The ranks of the communicator the file counted, where the file says (a plugin record does)."""

    def add(self, collective: Collective, size: int, *, duration_us: float | None, calls: float = 1.0) -> None:
        self.calls.setdefault((collective, size), CallStats()).add(duration_us, calls)


@dataclass(frozen=True)
class JobCalls:
    """Per-rank calls of the job: the mean over the files (ranks) imported."""

    calls: Mapping[tuple[Collective, int], CallStats]
    skipped: Mapping[str, float]
    files: tuple[str, ...]
    kinds: tuple[Kind, ...]
    ranks: tuple[int | None, ...]
    lower_bound: tuple[str, ...]

    @property
    def timed(self) -> bool:
        """Whether every counted call carried a duration (then the trace's own times can weigh buckets)."""
        return bool(self.calls) and all(s.timed_calls >= s.calls > 0 for s in self.calls.values())


def per_rank(files: Iterable[FileCalls]) -> JobCalls:
    """The files' calls averaged over the files: each file is one rank, each call counted once."""
    files = list(files)
    if not files:
        raise ValueError("no file to import")
    seen: dict[tuple[Kind, int], str] = {}
    for f in files:
        if f.rank is not None:
            key = (f.kind, f.rank)
            if key in seen:
                raise WorkloadFileError(f.source, f"rank {f.rank} was already imported from {seen[key]}")
            seen[key] = f.source
    # A process's files (one per communicator) add up; the job's per-rank figure is the mean over processes.
    n = len({f.process if f.process is not None else f"file:{i}" for i, f in enumerate(files)})
    total: dict[tuple[Collective, int], CallStats] = {}
    skipped: Counter[str] = Counter()
    for f in files:
        for call, stats in f.calls.items():
            merged = total.setdefault(call, CallStats())
            merged.calls += stats.calls / n
            merged.timed_calls += stats.timed_calls / n
            merged.time_us += stats.time_us / n
        skipped.update(f.skipped)
    if not total:
        raise WorkloadFileError(", ".join(f.source for f in files), "no collective call to weigh" + _why_empty(files))
    return JobCalls(
        calls=dict(sorted(total.items())),
        skipped={name: count / n for name, count in sorted(skipped.items())},
        files=tuple(f.source for f in files),
        kinds=tuple(dict.fromkeys(f.kind for f in files)),
        ranks=tuple(f.rank for f in files),
        lower_bound=tuple(dict.fromkeys(f.lower_bound for f in files if f.lower_bound)),
    )


def _why_empty(files: list[FileCalls]) -> str:
    # NCCL runs a one-rank communicator's collectives without asking the tuner plugin, so its record is
    # empty; importing it must not replace a workload with nothing.
    if any(f.kind == "plugin-record" and f.communicator_ranks == 1 for f in files):
        return " (a tuner plugin record of a one-rank communicator: NCCL does not ask the plugin about its calls)"
    return ""
