"""The report's measurement figures: speedup and busbw per size, the search history, node-pair bandwidth.

Purpose: every figure of ``report.html`` in page order (``report_figures``), from the study's outcome, the
summary's per-bucket rows and the topology's pair matrix.

Non-goals: statistics (the proof's bounds are drawn as given) and HTML (``page``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never a display; before pyplot is imported
import matplotlib.pyplot as plt

from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.report.compared_profiles import compared_profiles
from topo_tune.tuner.report.figure import FIG_H, FIG_W, MEASURED, SIMULATED, ReportFigure, encode_png, size_axis
from topo_tune.tuner.report.knobs import knob_figure
from topo_tune.tuner.speedup_text import precise
from topo_tune.tuner.study import StudyOutcome


def report_figures(
    outcome: StudyOutcome, summary: Mapping[str, Any], pairs: PairMatrix, racks: Mapping[str, str]
) -> list[ReportFigure]:
    """Every figure of the report, in page order."""
    label = SIMULATED if outcome.simulated else MEASURED
    figures: list[ReportFigure] = []
    base, tuned = compared_profiles(outcome)
    tuned_name = "tuned" if outcome.chosen is not None else "closest candidate"
    if base is not None:
        for collective in sorted({s.collective for s in base.samples}):
            rows = [r for r in summary.get("buckets") or [] if r.get("collective") == collective]
            if tuned is not None:
                figures.append(_speedup_figure(collective, base, tuned, rows, label=label, tuned_name=tuned_name))
            figures.append(_busbw_figure(collective, base, tuned, label=label, tuned_name=tuned_name))
    knobs = knob_figure(outcome, label)
    if knobs is not None:
        figures.append(knobs)
    figures.append(_history_figure(outcome, label))
    if len(pairs.names) > 1:
        figures.append(_topology_figure(pairs, racks, label))
    return figures


def _speedup_figure(
    collective: str,
    base: Measurements,
    tuned: Measurements,
    rows: Sequence[Mapping[str, Any]],
    *,
    label: str,
    tuned_name: str,
) -> ReportFigure:
    points = sorted(
        (s.bytes, b.time_us / s.time_us)
        for s in tuned.samples
        if s.collective == collective and (b := base.get(collective, s.bytes)) is not None
    )
    fig, ax = plt.subplots(figsize=(FIG_W, FIG_H))
    lo_size = min((p[0] for p in points), default=1)
    hi_size = max((p[0] for p in points), default=2)
    banded = False
    for row in rows:
        low, high = row.get("ci_low"), row.get("ci_high")
        if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
            continue
        left, right = max(int(row.get("min_bytes", lo_size)), lo_size), min(int(row.get("max_bytes", hi_size)), hi_size)
        if left > right:
            continue
        ax.fill_between(
            [left, right],
            [low, low],
            [high, high],
            color="tab:orange",
            alpha=0.3,
            lw=0,
            label=None if banded else "bucket speedup and its CI",
        )
        speedup = row.get("speedup")
        if isinstance(speedup, (int, float)):
            ax.plot([left, right], [speedup, speedup], color="tab:orange", lw=1.5)
        banded = True
    ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color="tab:blue", label=f"{tuned_name} / defaults")
    ax.axhline(1.0, color="black", lw=1, ls="--", label="1.0 = NCCL's defaults")
    ax.set_ylim(*_speedup_axis([p[1] for p in points], rows))
    size_axis(ax)
    ax.set_ylabel("speedup (time, defaults / tuned)")
    ax.set_title(f"{collective}: speedup per size [{label}]")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    caption = (
        f"{collective}: speedup per message size of the {tuned_name} over NCCL's defaults (geometric mean over "
        "the proof's pairs); in orange each size bucket's proven speedup with its confidence interval (the "
        "decision is made per bucket). Above the dashed line is faster. "
        f"[{label}]"
    )
    return ReportFigure(f"speedup-{collective}.png", caption, encode_png(fig), "speedup")


def _speedup_axis(points: Sequence[float], rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """The y range: every measured point, 1.0 and every precise bucket's bounds, padded by 10 %. A bucket whose
    interval is not precise (``speedup_text.precise``) is clipped to it, so ``[0.000, 9410139.772]`` cannot
    flatten every other line of the plot."""
    values = [*points, 1.0]
    for row in rows:
        low, high, point = row.get("ci_low"), row.get("ci_high"), row.get("speedup")
        if isinstance(point, (int, float)) and math.isfinite(point):
            values.append(float(point))
        if isinstance(low, (int, float)) and isinstance(high, (int, float)) and precise(low, high):
            values += [float(low), float(high)]
    low_y, high_y = min(values), max(values)
    pad = (high_y - low_y) * 0.1 or 0.05
    return max(low_y - pad, 0.0), high_y + pad


def _busbw_figure(
    collective: str, base: Measurements, tuned: Measurements | None, *, label: str, tuned_name: str
) -> ReportFigure:
    fig, ax = plt.subplots(figsize=(FIG_W, FIG_H))
    for m, name, style in ((base, "NCCL defaults", "o-"), (tuned, tuned_name, "s-")):
        if m is None:
            continue
        pts = sorted((s.bytes, s.busbw_gbs) for s in m.samples if s.collective == collective)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name)
    size_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("bus bandwidth (GB/s, log)")
    ax.set_title(f"{collective}: busbw, defaults vs {tuned_name} [{label}]")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    caption = f"{collective}: bus bandwidth per message size, log–log, as nccl-tests reports it. [{label}]"
    return ReportFigure(f"busbw-{collective}.png", caption, encode_png(fig), "busbw")


def _history_figure(outcome: StudyOutcome, label: str) -> ReportFigure:
    fig, ax = plt.subplots(figsize=(FIG_W, FIG_H))
    best = -math.inf
    done, bx, by = [], [], []
    for t in sorted(outcome.trials, key=lambda t: t.number):
        if t.value is not None and t.state == "complete":
            done.append((t.number, t.value))
            best = max(best, t.value)
        if best > -math.inf:
            bx.append(t.number)
            by.append(best)
    pruned = [
        (t.number, t.intermediate[-1][1] if t.intermediate else 1.0) for t in outcome.trials if t.state == "pruned"
    ]
    failed = [t.number for t in outcome.trials if t.state not in ("complete", "pruned", "running", "waiting")]
    ax.plot([d[0] for d in done], [d[1] for d in done], "o", alpha=0.7, label="completed trial")
    ax.step(bx, by, where="post", color="tab:green", label="best so far")
    if pruned:
        ax.plot([p[0] for p in pruned], [p[1] for p in pruned], "v", color="tab:orange", label="pruned (partial)")
    if failed:
        ax.plot(failed, [1.0] * len(failed), "x", color="red", ms=9, label="failed")
    ax.axhline(1.0, color="black", lw=1, ls="--")
    ax.set_xlabel("trial")
    ax.set_ylabel("speedup over NCCL's defaults")
    ax.set_title(f"search history [{label}]")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    caption = f"Each trial's weighted speedup during the search; pruned and failed trials are listed below. [{label}]"
    return ReportFigure("history.png", caption, encode_png(fig), "history")


def _topology_figure(pairs: PairMatrix, racks: Mapping[str, str], label: str) -> ReportFigure:
    names = list(pairs.names)
    order = sorted(range(len(names)), key=lambda i: (racks.get(names[i], ""), names[i]))
    bandwidth = pairs.bandwidth()
    grid = [[bandwidth[i][j] if i != j and math.isfinite(bandwidth[i][j]) else math.nan for j in order] for i in order]
    fig, ax = plt.subplots(figsize=(FIG_W, max(FIG_H, min(9.0, 0.25 * len(names) + 2.0))))
    image = ax.imshow(grid, cmap="viridis")
    shown = [names[i] for i in order]
    ax.set_xticks(range(len(shown)), shown, rotation=90, fontsize=7)
    ax.set_yticks(range(len(shown)), shown, fontsize=7)
    rack_list = [racks.get(n, "") for n in shown]
    for k in range(1, len(shown)):
        if rack_list[k] != rack_list[k - 1]:
            ax.axhline(k - 0.5, color="white", lw=2)
            ax.axvline(k - 0.5, color="white", lw=2)
    fig.colorbar(image, ax=ax, label="GB/s")
    ax.grid(False)
    ax.set_title(f"node-pair bandwidth [{label}]")
    caption = (
        "Bandwidth between node pairs (probed where measured, else modelled), nodes grouped by rack; white lines "
        f"are rack boundaries. [{label}]"
    )
    return ReportFigure("topology.png", caption, encode_png(fig), "topology")
