"""render_report: the whole ``report.html`` page, its sections in order.

Non-goals: drawing figures (``figures``) and writing files (``tuner.outputs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from topo_tune.tuner.report.figure import ReportFigure
from topo_tune.tuner.report.job_comparisons import comparison_section
from topo_tune.tuner.report.learning_evidence import evidence_section
from topo_tune.tuner.report.markup import STYLESHEET, figure_html, page_text
from topo_tune.tuner.report.summary_box import summary_box
from topo_tune.tuner.report.tables import bucket_table, closest_section, size_table, tradeoff_section, trial_table
from topo_tune.tuner.study import StudyOutcome


def render_report(
    summary: Mapping[str, Any],
    figures: Sequence[ReportFigure],
    *,
    outcome: StudyOutcome,
    files: Sequence[str],
    nodes: Sequence[str],
    ranks: int,
    comparisons: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The whole page; ``figures`` from :func:`report_figures`; ``comparisons`` as ``job_comparisons`` takes them."""
    e = page_text
    simulated = bool(summary.get("simulated"))
    badge = "<span class='badge sim'>SIMULATED</span>" if simulated else "<span class='badge meas'>MEASURED</span>"
    origin = (
        "Every figure comes from the sim backend's analytic model of NCCL, not from hardware."
        if simulated
        else "Every figure was measured on the cluster's nodes."
    )
    by_section: dict[str, list[ReportFigure]] = {}
    for f in figures:
        by_section.setdefault(f.section, []).append(f)

    def figs(*sections: str) -> str:
        return (
            "<div class='figs'>" + "".join(figure_html(f) for s in sections for f in by_section.get(s, [])) + "</div>"
        )

    study = summary.get("study") or {}
    no_knobs = (
        ""
        if "knobs" in by_section
        else "<p class='note'>Too few completed trials with a varied knob to estimate the knobs' importance.</p>"
    )
    sections = [
        summary_box(summary, files, nodes, ranks),
        "<h2 id='speedup'>Speedup per message size</h2>" + figs("speedup"),
        "<h2 id='buckets'>Per collective and size bucket</h2>" + bucket_table(summary),
        "<h2 id='busbw'>Bus bandwidth, defaults vs tuned</h2>" + figs("busbw") + size_table(outcome),
        closest_section(summary),
        tradeoff_section(summary),
        "<h2 id='trials'>What was tried</h2>" + figs("knobs", "history") + no_knobs + trial_table(summary),
        comparison_section(comparisons),
        evidence_section(None, version=str(summary.get("config_version", ""))),
        "<h2 id='topology'>Topology</h2>" + figs("topology") if "topology" in by_section else "",
    ]
    body = "".join(sections)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>topo-tune report: {e(str(study.get("name", "")))}</title><style>{STYLESHEET}</style></head><body><main>
<h1>topo-tune report {badge}</h1>
<div class="sub">{e(str(study.get("name", "")))} · config version
<code>{e(str(summary.get("config_version", "")))}</code> · {e(origin)}</div>
{body}
</main></body></html>
"""
