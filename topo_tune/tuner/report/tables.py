"""The report's tables: per-bucket decisions, the trade-off, the nccl-tests-style size table, what came
closest, and every trial with its reason.

Purpose: ``summary.json`` rendered generically: a field a row lacks is left out, a field it gains shows.

Non-goals: the verdict (``summary_box``) and the figures (``figures``, ``knobs``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from topo_tune.tuner.report.compared_profiles import compared_profiles
from topo_tune.tuner.report.figure import size_label
from topo_tune.tuner.report.markup import data_table, fmt, page_text
from topo_tune.tuner.speedup_text import SEARCH_VS_PROOF, speedup_text
from topo_tune.tuner.study import StudyOutcome


def bucket_table(summary: Mapping[str, Any]) -> str:
    rows = [r for r in summary.get("buckets") or [] if isinstance(r, Mapping)]
    if not rows:
        return "<p class='note'>No finalist was proven: no per-bucket comparison.</p>"
    return _decision_table(rows) + _rule_note(summary, rows)


_KNOWN = ["collective", "bucket", "weight", "decision", "speedup_text", "decided_at_pairs", "pairs"]
_KNOWN += ["p_value", "cv_baseline", "cv_tuned"]


def _decision_table(rows: Sequence[Mapping[str, Any]]) -> str:
    # The bounds are in the speedup's text (the one way every output writes them), not columns of their own.
    skip = {"min_bytes", "max_bytes", "scored_by", "confidence", "p_value_min_effect", "speedup", "ci_low", "ci_high"}
    skip |= {"precise"}
    extra = [k for k in rows[0] if k not in _KNOWN and k not in skip]
    columns = ["collective", "bucket", "weight", "decision", "speedup [bounds]"]
    columns += ["decided at pairs", "pairs", "p", "CV defaults", "CV tuned", *extra]
    body, classes = [], []
    for r in rows:
        text = r.get("speedup_text")
        if not isinstance(text, str):  # a summary from before the text: formatted the same way
            low, high, point = r.get("ci_low"), r.get("ci_high"), r.get("speedup")
            numbers = all(isinstance(v, (int, float)) for v in (low, high, point))
            text = speedup_text(float(point), (float(low), float(high)), pairs=0, cv=math.nan) if numbers else "–"  # type: ignore[arg-type]
        known = [text if k == "speedup_text" else fmt(r.get(k)) for k in _KNOWN]
        body.append(known + [fmt(r.get(k)) for k in extra])
        decision = str(r.get("decision", ""))
        classes.append("good" if decision == "faster" else "bad" if decision in ("slower", "not shown safe") else "")
    return data_table(columns, body, left=4, classes=classes)


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
    return f"<p class='note'>{page_text('; '.join(parts))}</p>" if parts else ""


def tradeoff_section(summary: Mapping[str, Any]) -> str:
    t = summary.get("tradeoff")
    if not isinstance(t, Mapping) or not t:
        return ""
    e = page_text
    rows = [r for r in t.get("buckets") or [] if isinstance(r, Mapping) and (r.get("weight") or 0) > 0]
    accepts = "".join(f"<li>{e(str(a))}</li>" for a in t.get("accepted_by") or [])
    env = ", ".join(f"{k}={v}" for k, v in sorted((t.get("env") or {}).items())) or "no NCCL variable"
    return (
        "<h2 id='tradeoff'>Trade-off (not the result)</h2>"
        f"<p>Trial {e(str(t.get('trial')))} ({e(env)}, order {e(str(t.get('rank_order', '?')))}) measured "
        f"{fmt(t.get('speedup'))}× weighted but was not shown safe in every weighted bucket. Its files are in "
        f"<code>{e(str(t.get('files', 'tradeoff')))}/</code> beside the result, for a user who accepts its losses; "
        "they are not the config version.</p>"
        + (_decision_table(rows) if rows else "")
        + f"<p>What would accept it:</p><ul>{accepts}</ul>"
    )


def size_table(outcome: StudyOutcome) -> str:
    base, tuned = compared_profiles(outcome)
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
                    size_label(s.bytes),
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
        title = f"{page_text(collective)}: the nccl-tests-style table behind the plots"
        out.append(f"<details><summary>{title}</summary>{data_table(columns, rows, left=0)}</details>")
    return "".join(out)


def closest_section(summary: Mapping[str, Any]) -> str:
    if summary.get("chosen"):
        return ""
    e = page_text
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
            f"{r.get('collective')} {r.get('bucket')}: {r.get('decision')} ({r.get('speedup_text')})" for r in worse
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
            f"{fmt(best.get('proven_speedup'))}× in the proof (search {fmt(best.get('search_value'))}×). "
            f"Not promoted: {e(str(why))}.</p>"
        )
        rows = [
            [
                str(f.get("trial")),
                fmt(f.get("search_value")),
                fmt(f.get("proven_speedup")),
                fmt(f.get("promoted")),
                str(f.get("failure") or ""),
            ]
            for f in finalists
        ]
        parts.append(data_table(["trial", "search ×", "proven ×", "promoted", "failure"], rows, left=1))
        parts.append(f"<p class='note'>Search × against proven ×: {e(SEARCH_VS_PROOF)}.</p>")
    extra = summary.get("trade_off")  # a summary from elsewhere may carry one in its own shape: shown as given
    if isinstance(extra, Mapping) and extra:
        rows = [[str(k), fmt(v) if not isinstance(v, (dict, list)) else str(v)] for k, v in extra.items()]
        parts.append("<h3>Trade-off candidate</h3>" + data_table(["field", "value"], rows, left=2))
    return "".join(parts)


def table_rows(table: str) -> list[str]:
    """The rows of a tuner-plugin table, without its comment lines."""
    return [line.strip() for line in table.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def trial_table(summary: Mapping[str, Any]) -> str:
    trials = [t for t in summary.get("trials") or [] if isinstance(t, Mapping)]
    rows, classes = [], []
    for t in sorted(trials, key=lambda t: int(t.get("number", 0))):
        env = " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in sorted((t.get("env") or {}).items()))
        # Option and table trials share their base's environment: their table rows are what sets them apart.
        table = table_rows(str(t.get("tuner_table") or ""))
        if table:
            env = f"{env or '(defaults)'} + table: {'; '.join(table)}"
        state = str(t.get("state", ""))
        rows.append(
            [
                str(t.get("number")),
                str(t.get("role") or "search"),
                state,
                fmt(t.get("value")),
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
        data_table(
            columns,
            failed,
            left=7,
            classes=[c for c in classes if c],
        )
        if failed
        else "<p class='note'>No trial failed or was pruned.</p>"
    )
    every = data_table(columns, rows, left=7, classes=classes)
    return (
        f"<p class='note'>{page_text(summary_line)}. Failed and pruned trials, with the reason:</p>{listed}"
        f"<details><summary>every trial</summary>{every}</details>"
    )
