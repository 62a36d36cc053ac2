"""The report's HTML building blocks: the stylesheet, number formatting, tables and inline images.

Purpose: escaped, self-contained markup (images as ``data:`` URIs, no network, no other file).

Non-goals: what the page says (``summary_box``, ``tables``, ``page``).
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from typing import Any

from topo_tune.errors import ConfigError
from topo_tune.security.log_text import escaped_keeping_layout
from topo_tune.tuner.report.figure import ReportFigure

STYLESHEET = """
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


def page_text(value: object) -> str:
    """``value`` as the page's text (or an attribute's): HTML-escaped, and every control and bidirectional
    character but the newlines and tabs of a layout shown as its escape, so that a peer's text (a trial's failure
    reason, a job's metric) can neither reorder nor hide what the page shows."""
    return html.escape(escaped_keeping_layout(str(value)))


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.{digits}f}"
    return str(value)


def data_table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1, classes: Sequence[str] = ()
) -> str:
    e = page_text
    head = "".join(f"<th class='l'>{e(c)}</th>" if i < left else f"<th>{e(c)}</th>" for i, c in enumerate(columns))
    body = []
    for n, row in enumerate(rows):
        cls = f" class='{classes[n]}'" if n < len(classes) and classes[n] else ""
        cells = "".join(f"<td class='l'>{e(v)}</td>" if i < left else f"<td>{e(v)}</td>" for i, v in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table class='data'><tr>{head}</tr>{''.join(body)}</table>"


def figure_html(figure: ReportFigure) -> str:
    data = base64.b64encode(figure.png).decode()
    e = page_text
    return (
        f"<figure><img src='data:image/png;base64,{data}' alt='{e(figure.caption)}' data-name='{e(figure.name)}'>"
        f"<figcaption>{e(figure.caption)}</figcaption></figure>"
    )


def replaced_section(page: str, *, begin: str, end: str, section: str, where: str, name: str) -> str:
    """``page`` with the section marked by ``begin`` and ``end`` replaced by ``section`` (which carries the
    marks again); ``ConfigError`` naming ``where`` when the page has no such section."""
    start = page.find(begin)
    stop = page.find(end, start)
    if start < 0 or stop < 0:
        raise ConfigError(where, f"not a topo-tune report with a {name} section (written by init)")
    return page[:start] + section + page[stop + len(end) :]
