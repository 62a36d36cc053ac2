"""``report.html``: one self-contained page a platform team can act on.

Purpose: from ``summary.json``'s data (rendered generically: a field it lacks is left out, a field it gains
shows) and the study's measurements, render

* a summary box: the verdict, the chosen settings and rank order, the weighted speedup with its CI, and the
  commands that use the result (``topo-tune exec``/``env``, ``admin rollout create``, the hostfile);
* per collective, the speedup per message size with each bucket's CI as a band and the 1.0 line, and busbw
  of NCCL's defaults vs the tuned configuration on log–log axes, with the nccl-tests-style table behind them;
* the closest candidate when nothing was promoted, and the trade-off (the best finalist that could not be
  chosen, with its per-bucket decisions and what would accept it) whenever the summary carries one;
* the knobs' effects (Optuna's PED-ANOVA parameter importances, drawn by Optuna's own visualization module);
* the trial history, failed and pruned trials listed with their reasons;
* the node-pair bandwidth heatmap with rack boundaries.

Every figure is labelled SIMULATED or measured. Images are inline PNGs (``data:`` URIs): the file needs no
network and no other file. The same inputs give the same bytes (figures carry no date or version).

Non-goals: computing statistics (the proof does; this module only combines the per-bucket bounds it is
given), and writing files (``outputs`` does).
"""

from __future__ import annotations

import base64
import html
import io
import math
import shlex
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
import optuna
from optuna.importance import BaseImportanceEvaluator

matplotlib.use("Agg")  # files only: never a display; before pyplot is imported
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.study import StudyOutcome

__all__ = ["ReportFigure", "render_report", "report_figures", "weighted_ci"]

MEASURED = "measured"
FIG_W, FIG_H = 6.2, 3.5  # inches at 90 dpi: two figures side by side on a laptop screen
SIMULATED = "SIMULATED"


@dataclass(frozen=True)
class ReportFigure:
    """One PNG of the report: its file name under ``plots/``, its caption, and its bytes."""

    name: str
    caption: str
    png: bytes
    section: str  # speedup | busbw | knobs | history | topology


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    # No "Software"/date chunk: the same study gives the same bytes.
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _size_label(size: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:g}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{size:g}"


def _size_axis(ax: Any) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _size_label(v)))
    ax.set_xlabel("message size (bytes)")


def _shown_proof(outcome: StudyOutcome) -> Any:
    return outcome.chosen or max(outcome.proofs, key=lambda p: p.speedup, default=None)


def _profiles(outcome: StudyOutcome) -> tuple[Measurements | None, Measurements | None]:
    """The defaults and the tuned (or closest) configuration per size: the proof's per-size geometric means
    over its pairs when there is a proof, else the search's baseline and best trial."""
    proof = _shown_proof(outcome)
    if proof is not None and proof.baseline is not None and proof.candidate is not None:
        return proof.baseline, proof.candidate
    return outcome.baseline.measurements, outcome.best.measurements if outcome.best is not None else None


def report_figures(
    outcome: StudyOutcome, summary: Mapping[str, Any], pairs: PairMatrix, racks: Mapping[str, str]
) -> list[ReportFigure]:
    """Every figure of the report, in page order."""
    label = SIMULATED if outcome.simulated else MEASURED
    figures: list[ReportFigure] = []
    base, tuned = _profiles(outcome)
    tuned_name = "tuned" if outcome.chosen is not None else "closest candidate"
    if base is not None:
        for collective in sorted({s.collective for s in base.samples}):
            rows = [r for r in summary.get("buckets") or [] if r.get("collective") == collective]
            if tuned is not None:
                figures.append(_speedup_figure(collective, base, tuned, rows, label, tuned_name))
            figures.append(_busbw_figure(collective, base, tuned, label, tuned_name))
    knobs = _knob_figure(outcome, label)
    if knobs is not None:
        figures.append(knobs)
    figures.append(_history_figure(outcome, label))
    if len(pairs.names) > 1:
        figures.append(_topology_figure(pairs, racks, label))
    return figures


def _speedup_figure(  # noqa: PLR0917 - one call site, in page order
    collective: str,
    base: Measurements,
    tuned: Measurements,
    rows: Sequence[Mapping[str, Any]],
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
    _size_axis(ax)
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
    return ReportFigure(f"speedup-{collective}.png", caption, _png(fig), "speedup")


def _busbw_figure(
    collective: str, base: Measurements, tuned: Measurements | None, label: str, tuned_name: str
) -> ReportFigure:
    fig, ax = plt.subplots(figsize=(FIG_W, FIG_H))
    for m, name, style in ((base, "NCCL defaults", "o-"), (tuned, tuned_name, "s-")):
        if m is None:
            continue
        pts = sorted((s.bytes, s.busbw_gbs) for s in m.samples if s.collective == collective)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name)
    _size_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("bus bandwidth (GB/s, log)")
    ax.set_title(f"{collective}: busbw, defaults vs {tuned_name} [{label}]")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    caption = f"{collective}: bus bandwidth per message size, log–log, as nccl-tests reports it. [{label}]"
    return ReportFigure(f"busbw-{collective}.png", caption, _png(fig), "busbw")


def _knob_figure(outcome: StudyOutcome, label: str) -> ReportFigure | None:
    """Optuna's parameter-importance plot over the completed search trials: which knobs moved the speedup."""
    from optuna.importance import PedAnovaImportanceEvaluator  # noqa: PLC0415
    from optuna.visualization.matplotlib import plot_param_importances  # noqa: PLC0415

    done = [t for t in outcome.trials if t.state == "complete" and t.value is not None and not t.tuner_table]
    knobs = sorted({k for t in done for k in t.env} | {"rank_order"})
    values = {k: sorted({_knob_value(t.env, t.rank_order, k) for t in done}) for k in knobs}
    varied = [k for k in knobs if len(values[k]) > 1]
    if len(done) < 3 or not varied:
        return None
    dists: dict[str, optuna.distributions.BaseDistribution] = {
        k: optuna.distributions.CategoricalDistribution(values[k]) for k in varied
    }
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for t in done:
        assert t.value is not None
        study.add_trial(
            optuna.trial.create_trial(
                params={k: _knob_value(t.env, t.rank_order, k) for k in varied},
                distributions=dists,
                value=math.log(t.value),
            )
        )
    # Optuna switches matplotlib to its ggplot style sheet (globally): keep that to this one figure.
    with warnings.catch_warnings(), matplotlib.rc_context():
        # Optuna marks its matplotlib backend experimental and warns on every call.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = plot_param_importances(study, evaluator=_InNameOrder(PedAnovaImportanceEvaluator()))
        fig = ax.figure
        assert isinstance(fig, Figure)
        fig.set_size_inches(FIG_W, max(2.6, 0.3 * len(varied) + 1.3))
        ax.set_title("", loc="left")
        ax.set_title(f"knob importance [{label}]")
        ax.set_xlabel("importance for reaching the best trials")
        ax.set_ylabel("")
        legend = ax.get_legend()
        if legend is not None:
            legend.remove()
        png = _png(fig)
    caption = (
        f"Which knobs set the best trials apart, over the {len(done)} completed search trials: Optuna's "
        f"PED-ANOVA importances (a knob left unset counts as the value 'default'). [{label}]"
    )
    return ReportFigure("knobs.png", caption, png, "knobs")


class _InNameOrder(BaseImportanceEvaluator):
    """An evaluator's importances in knob-name order, rounded: PED-ANOVA returns them in an order that varies
    from process to process, which reorders knobs of equal importance (MIN_CTAS and MAX_CTAS, set together)
    and changes the figure's bytes between two runs of one study."""

    def __init__(self, inner: BaseImportanceEvaluator) -> None:
        self.inner = inner

    def evaluate(
        self, study: optuna.Study, params: list[str] | None = None, *, target: Callable[..., float] | None = None
    ) -> dict[str, float]:
        found = self.inner.evaluate(study, params, target=target)
        return {name: round(found[name], 12) for name in sorted(found)}


def _knob_value(env: Mapping[str, str], rank_order: str, knob: str) -> str:
    return rank_order if knob == "rank_order" else env.get(knob, "default")


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
    return ReportFigure("history.png", caption, _png(fig), "history")


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
    return ReportFigure("topology.png", caption, _png(fig), "topology")


# ---------------------------------------------------------------------------------------------- statistics


def weighted_ci(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """A conservative CI of the weighted geometric-mean speedup: the weighted geometric mean of the per-bucket
    bounds. It holds whatever the buckets' correlation (it is the perfectly correlated case, the widest).
    None when a row lacks its weight or bounds."""
    total = low = high = 0.0
    for row in rows:
        weight, lo, hi = row.get("weight"), row.get("ci_low"), row.get("ci_high")
        if not all(isinstance(v, (int, float)) for v in (weight, lo, hi)):
            return None
        assert isinstance(weight, (int, float)) and isinstance(lo, (int, float)) and isinstance(hi, (int, float))
        if weight <= 0:
            continue
        if lo <= 0 or hi <= 0:
            return None
        total += weight
        low += weight * math.log(lo)
        high += weight * math.log(hi)
    if total <= 0:
        return None
    return math.exp(low / total), math.exp(high / total)


# ---------------------------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:#f4f5f7;color:#1d2330}
main{max-width:1200px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d5d8de;padding-bottom:4px}
.sub{color:#5b6473;font-size:13px}
.badge{display:inline-block;padding:2px 8px;border-radius:4px;font-size:12px;font-weight:700;letter-spacing:.04em}
.badge.sim{background:#ffe1e1;color:#9b1c1c}.badge.meas{background:#dff3e4;color:#1c6b33}
.box{background:#fff;border:1px solid #d5d8de;border-radius:8px;padding:16px 20px;margin-top:16px}
.verdict{font-size:20px;font-weight:700;margin-bottom:8px}.promote{color:#1c6b33}.keep{color:#8a5a00}
.use{margin-top:10px}
.kv{border-collapse:collapse;font-size:14px}.kv td{padding:2px 10px 2px 0;vertical-align:top}
.kv td:first-child{color:#5b6473;white-space:nowrap}
pre{background:#1d2330;color:#e8ebf0;padding:10px 12px;border-radius:6px;font-size:12.5px;overflow-x:auto;
margin:4px 0 10px}
code{font-family:ui-monospace,Menlo,Consolas,monospace}
table.data{border-collapse:collapse;font-size:12.5px;background:#fff;margin:6px 0}
table.data th,table.data td{padding:3px 9px;border-bottom:1px solid #e3e5e9;text-align:right;white-space:nowrap}
table.data th{background:#eef0f3;font-weight:600}table.data td.l,table.data th.l{text-align:left}
tr.bad td{background:#fff1f1}tr.good td{background:#f0faf2}tr.pruned td{background:#fff8e6}
figure{background:#fff;border:1px solid #d5d8de;border-radius:8px;margin:0;padding:10px;box-sizing:border-box;
width:calc(50% - 6px)}
figure img{display:block;width:100%;height:auto}figcaption{font-size:12.5px;color:#5b6473;margin-top:4px}
.figs{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}.note{font-size:13px;color:#5b6473}
details summary{cursor:pointer;font-size:13px;color:#2d5fa8;margin:6px 0}
"""


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.{digits}f}"
    return str(value)


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1, classes: Sequence[str] = ()) -> str:
    e = html.escape
    head = "".join(f"<th class='l'>{e(c)}</th>" if i < left else f"<th>{e(c)}</th>" for i, c in enumerate(columns))
    body = []
    for n, row in enumerate(rows):
        cls = f" class='{classes[n]}'" if n < len(classes) and classes[n] else ""
        cells = "".join(f"<td class='l'>{e(v)}</td>" if i < left else f"<td>{e(v)}</td>" for i, v in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table class='data'><tr>{head}</tr>{''.join(body)}</table>"


def _img(figure: ReportFigure) -> str:
    data = base64.b64encode(figure.png).decode()
    e = html.escape
    return (
        f"<figure><img src='data:image/png;base64,{data}' alt='{e(figure.caption)}' data-name='{e(figure.name)}'>"
        f"<figcaption>{e(figure.caption)}</figcaption></figure>"
    )


def _commands(summary: Mapping[str, Any], files: Sequence[str], nodes: Sequence[str], ranks: int) -> str:
    version = str(summary.get("config_version") or "")
    q = shlex.quote
    node_list = ",".join(nodes)
    chosen = summary.get("chosen")
    lines = []
    if chosen:
        lines.append("# 1. Roll it out rack by rack (canary first, A/B gates, automatic rollback):")
        lines.append(f"topo-tune admin rollout create {q(version)} --canary 2")
    else:
        lines.append("# 1. Nothing to roll out: NCCL's defaults stay. (The site settings alone are version")
        lines.append(f"#    {version}; roll it out only to ship siteFixed settings.)")
    lines.append("# 2. Give a job its one pinned config version (every rank the same):")
    lines.append(f"topo-tune exec --nodes {q(node_list)} -- torchrun ...")
    lines.append(f'eval "$(topo-tune env --nodes {q(node_list)})"      # or export it into your own launcher')
    if "hostfile" in files:
        lines.append("# 3. Launch ranks in the chosen order (ranks contiguous per node):")
        lines.append(f"mpirun --hostfile hostfile -np {ranks} ...        # Open MPI; rankmap.json has the ranks")
    return "<pre><code>" + html.escape("\n".join(lines)) + "</code></pre>"


def _summary_box(summary: Mapping[str, Any], files: Sequence[str], nodes: Sequence[str], ranks: int) -> str:
    e = html.escape
    chosen = summary.get("chosen")
    version = str(summary.get("config_version") or "")
    rows = [r for r in summary.get("buckets") or [] if isinstance(r, Mapping)]
    if chosen:
        ci = weighted_ci(rows)
        level = rows[0].get("confidence") if rows else None
        named = f"bounds {float(level) * 100:g}% each side" if isinstance(level, (int, float)) else "bounds"
        ci_text = f" ({named} {ci[0]:.3f}× – {ci[1]:.3f}×, conservative)" if ci else ""
        verdict = (
            f"<div class='verdict promote'>Promote: {float(chosen['speedup']):.3f}× NCCL's defaults{e(ci_text)}</div>"
        )
        env = chosen.get("env") or {}
        settings = (
            "<br>".join(f"<code>{e(k)}={e(str(v))}</code>" for k, v in sorted(env.items())) or "none (order only)"
        )
        order = chosen.get("rank_order", "")
        node_order = " → ".join(chosen.get("node_order") or [])
        table = chosen.get("tuner_table") or ""
        facts = [
            ("config version", f"<code>{e(version)}</code>"),
            ("weighted speedup", f"{float(chosen['speedup']):.3f}×{e(ci_text)} (trial {e(str(chosen.get('trial')))})"),
            ("NCCL settings", settings),
            ("rank order", f"{e(str(order))}: <code>{e(node_order)}</code>"),
            ("tuner plugin table", "yes (nccl_tuner.conf, as proven)" if table else "no"),
        ]
    else:
        verdict = "<div class='verdict keep'>Keep NCCL's defaults</div>"
        facts = [
            ("config version", f"<code>{e(version)}</code> (site settings only)"),
            (
                "why",
                "no configuration was shown safe in every weighted bucket and faster in one; "
                "see “What came closest” below",
            ),
        ]
    study = summary.get("study") or {}
    facts.append(
        (
            "study",
            f"{e(str(study.get('name', '')))} · sampler {e(str(study.get('sampler', '')))}, "
            f"seed {e(str(study.get('seed', '')))} · NCCL {e(str(summary.get('nccl_version', '')))}",
        )
    )
    kv = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in facts)
    return (
        f"<section class='box' id='summary'>{verdict}<table class='kv'>{kv}</table>"
        f"<div class='use'><b>Use it</b>{_commands(summary, files, nodes, ranks)}</div></section>"
    )


def _bucket_table(summary: Mapping[str, Any]) -> str:
    rows = [r for r in summary.get("buckets") or [] if isinstance(r, Mapping)]
    if not rows:
        return "<p class='note'>No finalist was proven: no per-bucket comparison.</p>"
    return _decision_table(rows) + _rule_note(summary, rows)


_KNOWN = ["collective", "bucket", "weight", "decision", "speedup", "ci_low", "ci_high", "pairs"]
_KNOWN += ["p_value", "cv_baseline", "cv_tuned"]


def _decision_table(rows: Sequence[Mapping[str, Any]]) -> str:
    skip = {"min_bytes", "max_bytes", "scored_by", "confidence", "p_value_min_effect", "decided_at_pairs"}
    extra = [k for k in rows[0] if k not in _KNOWN and k not in skip]
    columns = ["collective", "bucket", "weight", "decision", "speedup", "lower bound", "upper bound", "pairs"]
    columns += ["p", "CV defaults", "CV tuned", *extra]
    body, classes = [], []
    for r in rows:
        body.append([_fmt(r.get(k)) for k in _KNOWN] + [_fmt(r.get(k)) for k in extra])
        decision = str(r.get("decision", ""))
        classes.append("good" if decision == "faster" else "bad" if decision in ("slower", "not shown safe") else "")
    return _table(columns, body, left=4, classes=classes)


def _rule_note(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    rule = summary.get("decision_rule") or {}
    confidence = rows[0].get("confidence")
    parts = []
    if isinstance(confidence, (int, float)):
        parts.append(f"Bounds: one-sided, each at {float(confidence) * 100:g}% confidence (sequential, over the looks)")
    if isinstance(rule, Mapping) and isinstance(rule.get("max_loss"), (int, float)):
        floor = 1 - float(rule["max_loss"])
        parts.append(
            f"shipped only when every bucket of weight > 0 is faster or no difference shown (lower bound >= "
            f"{floor:.3f}) and one is faster"
        )
    return f"<p class='note'>{html.escape('; '.join(parts))}</p>" if parts else ""


def _tradeoff_section(summary: Mapping[str, Any]) -> str:
    t = summary.get("tradeoff")
    if not isinstance(t, Mapping) or not t:
        return ""
    e = html.escape
    rows = [r for r in t.get("buckets") or [] if isinstance(r, Mapping) and (r.get("weight") or 0) > 0]
    accepts = "".join(f"<li>{e(str(a))}</li>" for a in t.get("accepted_by") or [])
    env = ", ".join(f"{k}={v}" for k, v in sorted((t.get("env") or {}).items())) or "no NCCL variable"
    return (
        "<h2 id='tradeoff'>Trade-off (not the result)</h2>"
        f"<p>Trial {e(str(t.get('trial')))} ({e(env)}, order {e(str(t.get('rank_order', '?')))}) measured "
        f"{_fmt(t.get('speedup'))}× weighted but was not shown safe in every weighted bucket. Its files are in "
        f"<code>{e(str(t.get('files', 'tradeoff')))}/</code> beside the result, for a user who accepts its losses; "
        "they are not the config version.</p>"
        + (_decision_table(rows) if rows else "")
        + f"<p>What would accept it:</p><ul>{accepts}</ul>"
    )


def _size_table(outcome: StudyOutcome) -> str:
    base, tuned = _profiles(outcome)
    if base is None:
        return ""
    tuned_name = "tuned" if outcome.chosen is not None else "closest"
    out = []
    for collective in sorted({s.collective for s in base.samples}):
        rows = []
        for s in sorted((s for s in base.samples if s.collective == collective), key=lambda s: s.bytes):
            t = tuned.get(collective, s.bytes) if tuned is not None else None
            rows.append(
                [
                    str(s.bytes),
                    _size_label(s.bytes),
                    f"{s.time_us:.2f}",
                    f"{s.busbw_gbs:.2f}",
                    f"{t.time_us:.2f}" if t else "–",
                    f"{t.busbw_gbs:.2f}" if t else "–",
                    f"{s.time_us / t.time_us:.3f}" if t else "–",
                ]
            )
        columns = [
            "size (B)",
            "",
            "defaults time (us)",
            "busbw (GB/s)",
            f"{tuned_name} time (us)",
            "busbw (GB/s)",
            "speedup",
        ]
        title = f"{html.escape(collective)}: the nccl-tests-style table behind the plots"
        out.append(f"<details><summary>{title}</summary>{_table(columns, rows, left=0)}</details>")
    return "".join(out)


def _closest(summary: Mapping[str, Any]) -> str:
    if summary.get("chosen"):
        return ""
    e = html.escape
    finalists = [f for f in summary.get("finalists") or [] if isinstance(f, Mapping)]
    parts = ["<h2 id='closest'>What came closest</h2>"]
    if not finalists:
        parts.append("<p>No trial beat NCCL's defaults in the search, so nothing went to the proof.</p>")
    else:
        best = max(finalists, key=lambda f: float(f.get("proven_speedup") or 0.0))
        trials = {t.get("number"): t for t in summary.get("trials") or [] if isinstance(t, Mapping)}
        trial = trials.get(best.get("trial"), {})
        env = ", ".join(f"{k}={v}" for k, v in sorted((trial.get("env") or {}).items())) or "no NCCL variable"
        buckets = [r for r in summary.get("buckets") or [] if isinstance(r, Mapping)]
        worse = [r for r in buckets if r.get("decision") in ("slower", "not shown safe") and (r.get("weight") or 0) > 0]
        better = [r for r in buckets if r.get("decision") == "faster"]
        reasons = [
            f"{r.get('collective')} {r.get('bucket')}: {r.get('decision')} ({_fmt(r.get('speedup'))}×, "
            f"CI {_fmt(r.get('ci_low'))}–{_fmt(r.get('ci_high'))})"
            for r in worse
        ]
        why = best.get("failure") or (
            "; ".join(reasons)
            if reasons
            else "no bucket was shown faster beyond noise and the minimum gain"
            if not better
            else "no bucket was shown faster"
        )
        parts.append(
            f"<p>Trial {e(str(best.get('trial')))} ({e(env)}, order {e(str(trial.get('rank_order', '?')))}): "
            f"{_fmt(best.get('proven_speedup'))}× in the proof (search {_fmt(best.get('search_value'))}×). "
            f"Not promoted: {e(str(why))}.</p>"
        )
        rows = [
            [
                str(f.get("trial")),
                _fmt(f.get("search_value")),
                _fmt(f.get("proven_speedup")),
                _fmt(f.get("promoted")),
                str(f.get("failure") or ""),
            ]
            for f in finalists
        ]
        parts.append(_table(["trial", "search ×", "proven ×", "promoted", "failure"], rows, left=1))
    extra = summary.get("trade_off")  # a summary from elsewhere may carry one in its own shape: shown as given
    if isinstance(extra, Mapping) and extra:
        rows = [[str(k), _fmt(v) if not isinstance(v, (dict, list)) else str(v)] for k, v in extra.items()]
        parts.append("<h3>Trade-off candidate</h3>" + _table(["field", "value"], rows, left=2))
    return "".join(parts)


def _trial_table(summary: Mapping[str, Any]) -> str:
    trials = [t for t in summary.get("trials") or [] if isinstance(t, Mapping)]
    rows, classes = [], []
    for t in sorted(trials, key=lambda t: int(t.get("number", 0))):
        env = " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in sorted((t.get("env") or {}).items()))
        state = str(t.get("state", ""))
        rows.append(
            [
                str(t.get("number")),
                str(t.get("role") or "search"),
                state,
                _fmt(t.get("value")),
                str(t.get("rank_order", "")),
                env or "(defaults)",
                str(t.get("reason") or ""),
            ]
        )
        classes.append("" if state == "complete" else "pruned" if state == "pruned" else "bad")
    counts: dict[str, int] = {}
    for t in trials:
        counts[str(t.get("state"))] = counts.get(str(t.get("state")), 0) + 1
    failed = [r for r, c in zip(rows, classes, strict=True) if c]
    summary_line = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    columns = ["trial", "role", "state", "speedup", "order", "NCCL settings", "reason"]
    listed = (
        _table(
            columns,
            failed,
            left=7,
            classes=[c for c in classes if c],
        )
        if failed
        else "<p class='note'>No trial failed or was pruned.</p>"
    )
    every = _table(columns, rows, left=7, classes=classes)
    return (
        f"<p class='note'>{html.escape(summary_line)}. Failed and pruned trials, with the reason:</p>{listed}"
        f"<details><summary>every trial</summary>{every}</details>"
    )


def render_report(
    summary: Mapping[str, Any],
    figures: Sequence[ReportFigure],
    *,
    outcome: StudyOutcome,
    files: Sequence[str],
    nodes: Sequence[str],
    ranks: int,
) -> str:
    """The whole page; ``figures`` from :func:`report_figures`."""
    e = html.escape
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
        return "<div class='figs'>" + "".join(_img(f) for s in sections for f in by_section.get(s, [])) + "</div>"

    study = summary.get("study") or {}
    no_knobs = (
        ""
        if "knobs" in by_section
        else "<p class='note'>Too few completed trials with a varied knob to estimate the knobs' importance.</p>"
    )
    sections = [
        _summary_box(summary, files, nodes, ranks),
        "<h2 id='speedup'>Speedup per message size</h2>" + figs("speedup"),
        "<h2 id='buckets'>Per collective and size bucket</h2>" + _bucket_table(summary),
        "<h2 id='busbw'>Bus bandwidth, defaults vs tuned</h2>" + figs("busbw") + _size_table(outcome),
        _closest(summary),
        _tradeoff_section(summary),
        "<h2 id='trials'>What was tried</h2>" + figs("knobs", "history") + no_knobs + _trial_table(summary),
        "<h2 id='topology'>Topology</h2>" + figs("topology") if "topology" in by_section else "",
    ]
    body = "".join(sections)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>topo-tune report: {e(str(study.get("name", "")))}</title><style>{_CSS}</style></head><body><main>
<h1>topo-tune report {badge}</h1>
<div class="sub">{e(str(study.get("name", "")))} · config version
<code>{e(str(summary.get("config_version", "")))}</code> · {e(origin)}</div>
{body}
</main></body></html>
"""
