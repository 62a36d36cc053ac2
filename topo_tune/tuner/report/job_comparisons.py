"""The report's "What jobs measured" section: the A/B comparisons jobs ran themselves (``exec --compare``).

Purpose: the figure a user acts on is the job's own (micro-benchmarks only predict), so the page that
presents a tuning result also shows what jobs measured with the versions. The tuning pass writes the page
before any job has run its version, so the section is marked in the page and filled in later, in place:
``topo-tune admin job comparisons --report report.html`` replaces the marked section with the comparisons
the controller holds, and leaves the rest of the page byte for byte as it was.

Input is plain data (each comparison as ``admin job comparisons -o json`` prints it), so this module needs no
wire code. Non-goals: computing the figures (the controller did, with the proof's statistics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from topo_tune.tuner.report.markup import data_table, fmt, replaced_section

BEGIN = "<!-- topo-tune: job comparisons -->"
END = "<!-- /topo-tune: job comparisons -->"


def _arm(name: str, version: str) -> str:
    return name if name in (version, "defaults") else f"{name} ({version or 'NCCL defaults'})"


def comparison_section(comparisons: Sequence[Mapping[str, Any]]) -> str:
    """The marked section: one row per comparison, newest first, or a note saying how to get one."""
    heading = "<h2 id='jobs'>What jobs measured</h2>"
    if not comparisons:
        body = (
            "<p class='note'>No job has compared versions yet. Run the job's own A/B on every node of a job, "
            "e.g. <code>topo-tune exec --compare stable --against defaults --pairs 5 --metric "
            "'step_time=([0-9.]+)' -- torchrun ... train.py</code>, then refresh this section with "
            "<code>topo-tune admin job comparisons --report report.html</code>.</p>"
        )
        return f"{BEGIN}{heading}{body}{END}"
    rows, classes = [], []
    for c in comparisons:
        job = c["job"]
        complete = bool(c["complete"])
        rows.append(
            [
                str(job["job_id"]),
                str(c.get("created_at") or ""),
                _arm(job["candidate"], job["candidate_version"]),
                _arm(job["against"], job["against_version"]),
                f"{job['metric']} ({'higher' if job['higher_is_better'] else 'lower'} is better)",
                f"{len(job['runs'])}/{2 * int(job['pairs'])}",
                fmt(c["candidate_median"], 4) if complete else "–",
                fmt(c["against_median"], 4) if complete else "–",
                fmt(c["gain"]) if complete else "–",
                f"{fmt(c['ci_low'])}–{fmt(c['ci_high'])} ({c['confidence']:.0%})" if complete else "–",
                str(c["decision"]) if complete else "incomplete",
            ]
        )
        classes.append({"faster": "good", "slower": "bad"}.get(str(c["decision"]), ""))
    columns = ["job", "recorded (UTC)", "candidate", "against", "metric", "runs", "candidate median"]
    columns += ["against median", "gain", "CI", "decision"]
    note = (
        "<p class='note'>Measured by the jobs themselves, on their own command: each pair ran both arms "
        "back to back in an order derived from the job id. Gain: the geometric mean over the pairs of the "
        "candidate's advantage (above 1, the candidate was better); CI and decision are the tuner's proof "
        "statistics over the pairs.</p>"
    )
    table = data_table(columns, rows, left=5, classes=classes)
    return f"{BEGIN}{heading}{table}{note}{END}"


def with_comparisons(page: str, comparisons: Sequence[Mapping[str, Any]], *, where: str) -> str:
    """``page`` with its marked section replaced; ``ConfigError`` naming ``where`` when it has none."""
    section = comparison_section(comparisons)
    return replaced_section(page, begin=BEGIN, end=END, section=section, where=where, name="job comparisons")
