"""What the chosen configuration gains the job: the weights' source and, for an imported workload, the
predicted change of the job's collective time.

An imported workload's weights are each (collective, bucket)'s share of the job's collective time, so a
bucket proven ``s`` times faster takes ``1/s`` of its share: the job's collective time becomes
``sum(w / s) / sum(w)`` of what it was, over the buckets the proof weighed. With ``collectiveTimeUs`` (what
the import measured or modelled per rank) that is also a time. Hand-written weights are relative
importances, not time shares: no time is predicted from them.

Non-goals: the speedup itself (the proof's) and its formatting beyond this one entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.tuner.proof import FinalistProof

__all__ = ["WorkloadSource", "gain_line", "workload_gain"]


@dataclass(frozen=True)
class WorkloadSource:
    """Where ``workload`` in cluster.yaml came from, as the report states it."""

    source: str | None = None
    """The import's one-line source (files, kind, weights' source); None: hand-written."""
    collective_time_us: float | None = None

    @property
    def label(self) -> str:
        if self.source is None:
            return "hand-written in cluster.yaml (relative weights, not times)"
        return f"imported: {self.source}"


def workload_gain(chosen: FinalistProof | None, source: WorkloadSource) -> dict[str, object]:
    """The ``workload`` entry of summary.json."""
    out: dict[str, object] = {
        "source": source.label,
        "imported": source.source is not None,
        "collective_time_us": source.collective_time_us,
        "predicted_time_ratio": None,
        "predicted_collective_time_us": None,
    }
    if source.source is None:
        return out
    if chosen is None:
        out["predicted_time_ratio"] = 1.0  # the defaults are kept: nothing changes
    else:
        weighted = [b for b in chosen.weighted if b.comparison.speedup > 0]
        total = sum(b.weight for b in weighted)
        if total > 0:
            out["predicted_time_ratio"] = sum(b.weight / b.comparison.speedup for b in weighted) / total
    ratio = out["predicted_time_ratio"]
    if isinstance(ratio, float) and source.collective_time_us is not None:
        out["predicted_collective_time_us"] = source.collective_time_us * ratio
    return out


def gain_line(entry: dict[str, object]) -> str:
    """One line for people: the source, and for an imported workload the predicted time."""
    ratio = entry.get("predicted_time_ratio")
    line = f"workload weights: {entry.get('source')}"
    if isinstance(ratio, float):
        change = (ratio - 1.0) * 100
        line += f"; predicted change of the job's collective time: {change:+.1f}%"
        before, after = entry.get("collective_time_us"), entry.get("predicted_collective_time_us")
        if isinstance(before, float) and isinstance(after, float):
            line += f" ({before / 1000:.1f} ms -> {after / 1000:.1f} ms per rank over what was imported)"
    return line
