"""NCCL Inspector logs (NCCL >= 2.28, ``plugins/profiler/inspector``): one JSON object per collective.

Each record holds a ``header`` (``rank``, ``n_ranks`` of the communicator), and either ``coll_perf``
(``coll`` as NCCL names its function, ``coll_msg_size_bytes``, ``coll_exec_time_us``) or ``p2p_perf`` (a send
or receive, listed as skipped). Inspector's ``coll_msg_size_bytes`` is ``count × type size`` of NCCL's API
call, i.e. one rank's part for AllGather (send count) and ReduceScatter (receive count); nccl-tests' size is
``n_ranks`` times that, as Inspector's own bandwidth arithmetic also takes it. The records may be one per
line or pretty-printed one after another; a file holds the records of one process (one rank, possibly of
several communicators).

Non-goals: Inspector's Prometheus output (``NCCL_INSPECTOR_PROM_DUMP=1``), which keeps no per-call record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from topo_tune.errors import WorkloadFileError
from topo_tune.nccl.collectives import Collective
from topo_tune.workload.calls import FileCalls
from topo_tune.workload.collective_names import collective_named
from topo_tune.workload.json_stream import DEFAULT_LIMITS, JsonStream, Limits, open_text

__all__ = ["looks_like_inspector", "read_inspector_log"]

_PER_RANK_PART = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)


def looks_like_inspector(record: Mapping[str, Any]) -> bool:
    return "header" in record and ("coll_perf" in record or "p2p_perf" in record)


def read_inspector_log(path: Path, *, limits: Limits = DEFAULT_LIMITS) -> FileCalls:
    """The calls in ``path``; :class:`~topo_tune.errors.WorkloadFileError` on bad input."""
    source = str(path)
    out = FileCalls(source=source, kind="nccl-inspector")
    ranks: set[int] = set()
    with open_text(path) as text:
        stream = JsonStream(text, source=source, limits=limits)
        index = 0
        while not stream.at_end():
            index += 1
            try:
                record = stream.value()
            except WorkloadFileError as error:
                raise stream.error(f"record {index}: {error.reason}") from None
            if not isinstance(record, dict) or not looks_like_inspector(record):
                raise stream.error(f"record {index} is not an NCCL Inspector record (header and coll_perf)")
            header = record["header"]
            rank, n_ranks = _int(header, "rank"), _int(header, "n_ranks")
            if rank is None or not n_ranks:
                raise stream.error(f"record {index}: header.rank and header.n_ranks must be integers")
            ranks.add(rank)
            perf = record.get("coll_perf")
            if not isinstance(perf, dict):
                p2p = record.get("p2p_perf")
                out.skipped[str(p2p.get("p2p", "p2p")) if isinstance(p2p, dict) else "p2p"] += 1
                continue
            name = str(perf.get("coll", ""))
            collective = collective_named(name)
            size, time_us = _int(perf, "coll_msg_size_bytes"), perf.get("coll_exec_time_us")
            if collective is None:
                out.skipped[name or "(no coll)"] += 1
                continue
            if size is None:
                raise stream.error(f"record {index}: coll_perf.coll_msg_size_bytes must be an integer >= 0")
            if collective in _PER_RANK_PART:
                size *= n_ranks
            timed = isinstance(time_us, int | float) and not isinstance(time_us, bool) and time_us >= 0
            duration = float(time_us) if timed and time_us is not None else None
            if duration is not None and not math.isfinite(duration):
                raise stream.error(f"record {index}: coll_perf.coll_exec_time_us is {duration}, not a finite number")
            out.add(collective, size, duration_us=duration)
        if index == 0:
            raise stream.error("empty: no NCCL Inspector record")
    # One process writes one file; with several communicators its rank may differ between them.
    out.rank = next(iter(ranks)) if len(ranks) == 1 else None
    return out


def _int(data: object, key: str) -> int | None:
    if not isinstance(data, dict):
        return None
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
