"""The report's "What learning jobs showed" section: a version's evidence from production jobs
(``docs/learning.md``), per challenger and (collective, size class), in the words ``admin learning evidence``
uses.

Purpose: the page that presents a version also shows what its learning jobs measured once they have run. The
tuning pass writes the page before any job has, so the section is marked and filled in later, in place:
``topo-tune admin learning evidence ID --report report.html`` replaces it with the evidence the controller
holds and leaves the rest of the page byte for byte as it was.

Input is plain data (the evidence as ``admin learning evidence -o json`` prints it), so this module needs no
wire code. Non-goals: computing the evidence (the controller did, with the proof's statistics).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topo_tune.config.values import show_bytes
from topo_tune.tuner.report.markup import data_table, fmt, page_text, replaced_section

BEGIN = "<!-- topo-tune: learning evidence -->"
END = "<!-- /topo-tune: learning evidence -->"
_SHOWN_DIVERGENT = 10
"""Divergent jobs listed by name; the rest are counted."""
_COLUMNS = ["challenger", "collective", "size class", "table applies", "jobs (smaller arm)", "speedup"]
_COLUMNS += ["CI (one-sided bounds)", "decision"]


def _arm_name(arm: str) -> str:
    return "chosen table" if arm == "0" else f"challenger {arm}"


def _size_class(class_bytes: int) -> str:
    return f"({show_bytes(class_bytes // 2)}, {show_bytes(class_bytes)}]"


def _row_class(cell: Mapping[str, Any]) -> str:
    if not cell["applies"]:
        return ""
    return {"faster": "good", "slower": "bad", "not shown safe": "bad"}.get(str(cell["decision"]), "")


def evidence_section(evidence: Mapping[str, Any] | None, *, version: str) -> str:
    """The marked section: ``evidence`` for ``version``, or (None) a note saying how to get it."""
    e = page_text
    heading = "<h2 id='learning'>What learning jobs showed</h2>"
    if evidence is None:
        body = (
            "<p class='note'>No learning evidence shown yet. When cluster.yaml's learning.enabled is true and "
            "this version carries challenger tables, some of its production jobs run a challenger and time "
            "their collectives with NCCL's profiler events; show what they measured with "
            f"<code>topo-tune admin learning evidence {e(version)} --report report.html</code>.</p>"
        )
        return f"{BEGIN}{heading}{body}{END}"
    jobs = ", ".join(f"{_arm_name(arm)}: {n}" for arm, n in sorted(evidence["jobs_by_arm"].items())) or "none"
    divergent = list(evidence["divergent"])
    why = f" {evidence['learning_stopped_why']}" if evidence["learning_stopped_why"] else ""
    state = f"stopped{why}: new jobs run the chosen table" if evidence["learning_stopped"] else "allowed"
    parts = [
        heading,
        "<table class='kv'>",
        f"<tr><td>config version</td><td><code>{e(evidence['id'])}</code></td></tr>",
        f"<tr><td>learning</td><td>{e(state)}</td></tr>",
        f"<tr><td>jobs compared</td><td>{e(jobs)}</td></tr>",
        f"<tr><td>set aside as divergent</td><td>{len(divergent)}</td></tr>",
        "</table>",
    ]
    if divergent:
        listed = "".join(f"<li><code>{e(line)}</code></li>" for line in divergent[:_SHOWN_DIVERGENT])
        more = len(divergent) - _SHOWN_DIVERGENT
        parts.append(f"<ul class='note'>{listed}</ul>" + (f"<p class='note'>and {more} more</p>" if more > 0 else ""))
    cells = sorted(evidence["cells"], key=lambda c: (c["arm"], c["collective"], c["class_bytes"]))
    if cells:
        rows = [
            [
                str(c["arm"]),
                str(c["collective"]),
                _size_class(int(c["class_bytes"])),
                fmt(bool(c["applies"])),
                str(c["jobs"]),
                fmt(float(c["speedup"])),
                f"{fmt(float(c['ci_low']))}–{fmt(float(c['ci_high']))}",
                str(c["decision"]),
            ]
            for c in cells
        ]
        parts.append(data_table(_COLUMNS, rows, left=4, classes=[_row_class(c) for c in cells]))
    else:
        parts.append("<p class='note'>No size class has yet been timed by two jobs of a challenger and two of "
                     "the chosen table: nothing is compared.</p>")  # fmt: skip
    proposable = ", ".join(f"challenger {arm}" for arm in evidence["proposable"]) or "none"
    parts.append(f"<p>Proposable: {e(proposable)}.</p>")
    parts.append(
        "<p class='note'>Measured by production jobs of this version, each timing its own collectives with "
        "NCCL's profiler events; a job is one sample. Speedup: the chosen table's time over the challenger's "
        "(above 1, the challenger was faster), with one-sided bounds and decisions in the proof's words at its "
        "alpha and maxLoss. Table applies: the challenger's table changes the chosen one's choices in that "
        "size class (elsewhere both run the same choices). A challenger shown faster where it applies and "
        "never worse there is proposable: <code>topo-tune admin learning propose ID --arm N</code>, then "
        "rolled out like any version.</p>"
    )
    return BEGIN + "".join(parts) + END


def with_evidence(page: str, evidence: Mapping[str, Any], *, where: str) -> str:
    """``page`` with its marked section holding ``evidence``; ``ConfigError`` naming ``where`` when it has none."""
    section = evidence_section(evidence, version=str(evidence["id"]))
    return replaced_section(page, begin=BEGIN, end=END, section=section, where=where, name="learning evidence")
