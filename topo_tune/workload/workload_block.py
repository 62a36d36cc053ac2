"""The ``workload:`` block of ``cluster.yaml`` from imported weights, printed or written in place.

The block holds ``weights`` (collective → bucket → share of the job's collective time), ``source`` (the
files and the weights' source, which the report repeats) and ``collectiveTimeUs``; each bucket's calls and
bytes per rank ride along as comments. Writing replaces only that block of the file: every other line,
comments included, stays as it was; the old file is kept beside it (``FILE.bak``), and the new text is
validated as a whole cluster.yaml before anything is written.

Non-goals: editing any other part of ``cluster.yaml``; YAML round-tripping (the block is text).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from topo_tune.config.cluster import loads_cluster_config
from topo_tune.errors import ConfigError, PathError, WorkloadFileError
from topo_tune.security.safe_write import stage_file, write_file
from topo_tune.workload.calls import KIND_LABELS
from topo_tune.workload.weights import SOURCE_LABELS, WorkloadWeights

__all__ = ["as_data", "replace_block", "source_line", "workload_block", "write_block"]

_HEADER = re.compile(r"^workload\s*:")


def source_line(weights: WorkloadWeights) -> str:
    """One line naming the files and the weights' source, e.g. ``PyTorch profiler trace: a.json.gz (...)``."""
    job = weights.job
    kinds = ", ".join(KIND_LABELS[k] for k in job.kinds)
    names = ", ".join(Path(f).name for f in job.files)
    ranks = f"{len(job.files)} rank{'s' if len(job.files) != 1 else ''}"
    bound = "; call counts are lower bounds" if job.lower_bound else ""
    return f"{kinds}: {names} ({ranks}); weights from {SOURCE_LABELS[weights.source]}{bound}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def as_data(weights: WorkloadWeights) -> dict[str, Any]:
    """The ``-o json`` document: collectives, buckets, skipped calls and the source."""
    job = weights.job
    return {
        "collectives": {c: round(w, 6) for c, w in weights.collectives.items()},
        "buckets": [
            {
                "collective": load.collective.value,
                "bucket": load.bucket.name,
                "min_bytes": load.bucket.min_bytes,
                "max_bytes": load.bucket.max_bytes,
                "calls": load.calls,
                "bytes": load.bytes,
                "time_us": load.time_us,
                "weight": round(load.weight, 6),
                "weight_source": weights.source,
            }
            for load in weights.loads
        ],
        "skipped": dict(job.skipped),
        "oversized": {c.value: n for c, n in weights.oversized.items()},
        "source": {
            "kinds": list(job.kinds),
            "files": list(job.files),
            "ranks": list(job.ranks),
            "weights": weights.source,
            "collective_time_us": weights.total_time_us,
            "lower_bound": list(job.lower_bound),
            "summary": source_line(weights),
        },
    }


def workload_block(weights: WorkloadWeights) -> str:
    """The ``workload:`` block as YAML text (ends with a newline)."""
    job = weights.job
    lines = [
        "workload:",
        "  # written by topo-tune workload import: each (collective, size bucket)'s share of the job's",
        "  # collective time; per rank: calls, bytes.",
    ]
    for reason in job.lower_bound:
        lines.append(f"  # counts are lower bounds: {reason}")
    if job.skipped:
        listed = ", ".join(f"{name} x{_number(n)}" for name, n in job.skipped.items())
        lines.append(f"  # skipped (not a collective topo-tune measures): {listed}")
    for collective, calls in weights.oversized.items():
        lines.append(f"  # {collective.value}: {_number(calls)} calls above the largest bucket, not weighed")
    lines.append(f"  source: {json.dumps(source_line(weights))}")
    if weights.total_time_us is not None and weights.total_time_us > 0:
        lines.append(f"  collectiveTimeUs: {weights.total_time_us:.1f}")
    lines.append("  weights:")
    current = None
    for load in weights.loads:
        if load.collective is not current:
            current = load.collective
            lines.append(f"    {load.collective.value}:")
        lines.append(
            f"      {load.bucket.name}: {load.weight:.6f}  # {_number(load.calls)} calls, {_number(load.bytes)} bytes"
        )
    if not weights.loads:
        lines[-1] = "  weights: {}"
    return "\n".join(lines) + "\n"


def replace_block(text: str, block: str) -> str:
    """``text`` with its top-level ``workload:`` block replaced by ``block`` (appended when it has none)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _HEADER.match(line)), None)
    if start is None:
        sep = "" if not text or text.endswith("\n") else "\n"
        return text + sep + block
    end = start + 1
    while end < len(lines) and (lines[end][:1] in (" ", "\t") or not lines[end].strip()):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1  # blank lines before the next key stay with it
    return "".join(lines[:start]) + block + "".join(lines[end:])


def write_block(path: Path, weights: WorkloadWeights) -> Path:
    """Replace ``path``'s ``workload:`` block in place; the old file goes to ``path.bak``. Returns the backup.

    The new text must load as a cluster.yaml, or nothing is written. Both files are written by ``safe_write``
    with the original's mode, and a symlink at either is refused (:class:`~topo_tune.errors.FileWriteError`).
    """
    try:
        old = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise WorkloadFileError(str(path), f"cannot read it: {error}") from None
    new = replace_block(old, workload_block(weights))
    try:
        loads_cluster_config(new, source=str(path))
    except (ConfigError, PathError) as error:
        raise WorkloadFileError(str(path), f"with the imported workload it would not load: {error}") from None
    backup = path.with_name(path.name + ".bak")
    staged = stage_file(path, new)
    try:
        write_file(backup, old, mode=staged.mode)  # a 0600 cluster.yaml may hold a database URL; so may its copy
    except BaseException:
        staged.discard()
        raise
    staged.commit()
    return backup
