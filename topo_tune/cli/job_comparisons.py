"""``topo-tune admin job comparisons``: the A/B comparisons jobs measured themselves (``exec --compare``).

Also the one place a comparison is put in words for people: ``exec --compare`` prints the same lines.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import click

from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data, emit_line, emit_table
from topo_tune.client.admin import AdminClient
from topo_tune.jobs.compare.comparison_record import StoredComparison
from topo_tune.security.safe_write import write_file
from topo_tune.wire.job_comparisons import job_comparison_data


def arm_label(name: str, version: str) -> str:
    """An arm as named, with the version it resolved to when the name is not the version itself."""
    resolved = version or "NCCL defaults"
    return name if name in (version, "defaults") else f"{name} ({resolved})"


def gain_text(comparison: StoredComparison) -> str:
    figures = comparison.figures
    return "-" if figures is None else f"{figures.gain:.3f}x"


def ci_text(comparison: StoredComparison) -> str:
    figures = comparison.figures
    return "-" if figures is None else f"{figures.ci_low:.3f}-{figures.ci_high:.3f} ({figures.confidence:.0%})"


def verdict_lines(comparison: StoredComparison) -> list[str]:
    """The comparison for people: one table row per arm, then the gain, its interval and the decision."""
    job, figures = comparison.header, comparison.figures
    direction = "higher" if job.higher_is_better else "lower"
    lines = [
        f"job {job.job_id}: {len(comparison.runs)} of {2 * job.pairs} runs, metric {job.metric!r} "
        f"({direction} is better)",
        f"  {'ARM':<10} {'CONFIG':<40} {'MEDIAN':>12}  NODE RANK 0",
    ]
    medians = (None, None) if figures is None else (figures.candidate_median, figures.against_median)
    for arm, name, version, median, order in (
        ("candidate", job.candidate, job.candidate_version, medians[0], job.candidate_order),
        ("against", job.against, job.against_version, medians[1], job.against_order),
    ):
        shown = "-" if median is None else f"{median:.6g}"
        lines.append(f"  {arm:<10} {arm_label(name, version):<40} {shown:>12}  {order[0] if order else '-'}")
    if figures is not None:
        lines.append(
            f"  gain {gain_text(comparison)} (paired geometric mean; > 1: {job.candidate} is better), "
            f"{figures.confidence:.0%} CI {figures.ci_low:.3f}-{figures.ci_high:.3f}, "
            f"p = {figures.p_value:.2g}: {figures.decision.value}"
        )
    else:
        lines.append("  incomplete: the runs read on other nodes (their arm's node rank 0) are not recorded yet")
    return lines


@admin.group()
def job() -> None:
    """What jobs measured about the config they ran with.

    \b
    Examples:
      topo-tune admin job comparisons                  # every job's own A/B, newest first
      topo-tune admin job comparisons --job-id 4242 -o yaml   # one job's, with every run's value
      topo-tune admin job comparisons --report out/report.html  # show them in init's report
    """


@job.command()
@click.option("--job-id", default="", help="Only this job's comparisons.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option(
    "--report",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Also write them into this report.html's 'What jobs measured' section (init writes it empty).",
)
@connected
def comparisons(client: AdminClient, fmt: str, job_id: str, limit: int, report: Path | None) -> None:
    """The A/B comparisons jobs ran themselves with `topo-tune exec --compare`, newest first.

    \b
    GAIN is the geometric mean over the pairs of the --compare arm's advantage (the --against arm's
    step time over the candidate's, or the candidate's throughput over the --against arm's with
    --higher-is-better): above 1, the candidate was better. CI is the two-sided interval of the
    tuner's proof statistics (one-sided t bounds at alpha = 0.01 each); DECISION uses the proof's words.
    """
    found = client.list_job_comparisons(job_id=job_id, limit=limit)
    if report is not None:
        # Here, not at the top: the report's modules pull in matplotlib, which listing never needs.
        from topo_tune.tuner.report.job_comparisons import with_comparisons  # noqa: PLC0415

        data = [job_comparison_data(c) for c in found]
        page = with_comparisons(report.read_text(encoding="utf-8"), data, where="--report")
        write_file(report, page)  # a reader never sees half a page; a symlink there is refused
        emit_line(f"# {report}: {len(found)} job comparisons in 'What jobs measured'", err=True)
    if fmt != "table":
        emit_data([job_comparison_data(c) for c in found], fmt)
        return
    rows = [
        (
            c.header.job_id,
            c.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
            arm_label(c.header.candidate, c.header.candidate_version),
            arm_label(c.header.against, c.header.against_version),
            f"{len(c.runs)}/{2 * c.header.pairs}",
            "-" if c.figures is None else f"{c.figures.candidate_median:.4g}",
            "-" if c.figures is None else f"{c.figures.against_median:.4g}",
            gain_text(c),
            ci_text(c),
            "incomplete" if c.figures is None else c.figures.decision.value,
        )
        for c in found
    ]
    emit_table(
        f"{len(rows)} job comparisons",
        ("JOB", "AT (UTC)", "CANDIDATE", "AGAINST", "RUNS", "MEDIAN", "AGAINST MEDIAN", "GAIN", "CI", "DECISION"),
        rows,
    )
