"""The report's summary box: the verdict, the chosen settings and order, and the commands that use them.

Purpose: what a platform team acts on first: promote or keep NCCL's defaults, the weighted speedup with a
conservative CI (``weighted_ci``), and the ``topo-tune exec``/``env``, rollout and hostfile commands.

Non-goals: the per-bucket and per-trial detail (``tables``); computing the proof's statistics.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from topo_tune.tuner.report.markup import page_text
from topo_tune.tuner.report.tables import table_rows as rows_of_table
from topo_tune.tuner.speedup_text import speedup_text
from topo_tune.tuner.workload_gain import gain_line


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


def _speedup_text(chosen: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """The chosen weighted speedup as the study wrote it; for an older summary, formatted the same way."""
    text = chosen.get("speedup_text")
    if isinstance(text, str):
        return text
    ci = weighted_ci(rows)
    if ci is None:
        return f"{float(chosen['speedup']):.3f}x"
    return speedup_text(float(chosen["speedup"]), ci, pairs=0, cv=math.nan)


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
    return "<pre><code>" + page_text("\n".join(lines)) + "</code></pre>"


def summary_box(summary: Mapping[str, Any], files: Sequence[str], nodes: Sequence[str], ranks: int) -> str:
    e = page_text
    chosen = summary.get("chosen")
    version = str(summary.get("config_version") or "")
    rows = [r for r in summary.get("buckets") or [] if isinstance(r, Mapping)]
    if chosen:
        level = rows[0].get("confidence") if rows else None
        named = f"bounds {float(level) * 100:g}% each side" if isinstance(level, (int, float)) else "bounds"
        text = _speedup_text(chosen, rows)
        verdict = f"<div class='verdict promote'>Promote: {e(text)} NCCL's defaults</div>"
        env = chosen.get("env") or {}
        table = chosen.get("tuner_table") or ""
        table_rows = len(rows_of_table(str(table)))
        # A table ships even with no NCCL_* variable: "none" alone would hide what the version changes.
        unset = f"none in nccl.conf; the tuner plugin table sets {table_rows} row(s)" if table else "none (order only)"
        settings = "<br>".join(f"<code>{e(k)}={e(str(v))}</code>" for k, v in sorted(env.items())) or e(unset)
        order = chosen.get("rank_order", "")
        node_order = " → ".join(chosen.get("node_order") or [])
        facts = [
            ("config version", f"<code>{e(version)}</code>"),
            ("weighted speedup", f"{e(text)} ({e(named)}, conservative; trial {e(str(chosen.get('trial')))})"),
            ("NCCL settings", settings),
            ("rank order", f"{e(str(order))}: <code>{e(node_order)}</code>"),
            ("tuner plugin table", f"yes (nccl_tuner.conf, as proven: {table_rows} row(s))" if table else "no"),
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
    workload = summary.get("workload")
    if isinstance(workload, Mapping):
        facts.append(("workload weights", e(gain_line(dict(workload)).removeprefix("workload weights: "))))
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
