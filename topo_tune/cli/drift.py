"""``topo-tune admin drift``: drift checks of the active config version, and nodes whose topology changed."""

from __future__ import annotations

import click

from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data, emit_line, emit_table
from topo_tune.cli.progress import progress_lines
from topo_tune.client.admin import AdminClient
from topo_tune.drift_record import DriftCheck
from topo_tune.errors import ControllerError
from topo_tune.ids import ConfigVersionId
from topo_tune.wire.drift_checks import drift_check_data

STATUSES = ("running", "ok", "regressed", "failed", "skipped", "changed")


def _change(check: DriftCheck) -> str:
    change = check.busbw_change
    return "-" if change is None else f"{change:+.1%}"


@admin.group()
def drift() -> None:
    """Drift checks: is the active config version still as fast as its rollout measured it?

    \b
    The controller's leader re-measures the version the last completed rollout made every node run, on a
    few idle nodes of one of its waves, with the benchmark its gate ran there, and compares the bus
    bandwidth with what that gate measured. A drop beyond the threshold that a one-sided Welch test finds
    significant (p < alpha) is `regressed` (an event per node, the metric topo_tune_drift_regressions_total,
    and with openStudy a new study). A node that registered
    again with another topology fingerprint is listed as `changed`. Settings: `controller.drift` in
    cluster.yaml, or `topo-tune controller serve --drift-interval/--drift-threshold`.

    \b
    Examples:
      topo-tune admin drift list                    # newest first
      topo-tune admin drift list --status regressed
      topo-tune admin drift show dc-0123456789ab    # the figures, nodes and benchmark jobs of one check
      topo-tune admin drift run                     # check now (the leader), wait and print the verdict
    """


@drift.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only checks with this outcome.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@connected
def list_checks(client: AdminClient, fmt: str, status: str | None, limit: int) -> None:
    """Recent drift checks and topology changes, newest first."""
    found = client.list_drift_checks(limit=limit, status=status or "")
    if fmt != "table":
        emit_data([drift_check_data(c) for c in found], fmt)
        return
    rows = [
        (
            c.check_id,
            c.created_at.strftime("%Y-%m-%d %H:%M"),
            c.kind,
            c.status + (" (SIMULATED)" if c.simulated else ""),
            c.config_version or "-",
            ",".join(c.nodes) or "-",
            _change(c),
        )
        for c in found
    ]
    emit_table(
        f"{len(rows)} drift checks", ("ID", "AT (UTC)", "KIND", "STATUS", "VERSION", "NODES", "BUSBW CHANGE"), rows
    )


@drift.command()
@click.argument("check_id", metavar="ID")
@connected
def show(client: AdminClient, fmt: str, check_id: str) -> None:
    """One drift check: reference and measured bus bandwidth, its nodes, jobs and why it ended as it did."""
    _print_check(client.get_drift_check(check_id), fmt)


@drift.command()
@click.option(
    "--version", "version", default="", metavar="V", help="Refuse unless V is the active version (a guard for scripts)."
)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for its benchmark jobs and the verdict.")
@connected
def run(client: AdminClient, fmt: str, version: str, wait: bool) -> None:
    """Check for drift now, as the leader's periodic check does, and print the check.

    Exits 0 when the version is as fast as its rollout measured it (or the check is still running with
    --no-wait), 1 when it regressed, failed or was skipped (the message says why).

    \b
    Examples:
      topo-tune admin drift run
      topo-tune admin drift run --version cv-0123456789abcdef -o json
    """
    check = client.run_drift_check(version=ConfigVersionId(version))
    if wait and check.status == "running":
        emit_line(f"# drift check {check.check_id} measuring on {', '.join(check.nodes)} ...", err=True)
        check = client.watch_drift_check(
            check.check_id,
            progress_lines("benchmark jobs ended", lambda found: found.status == "running"),
        )
    _print_check(check, fmt)
    if check.status not in ("ok", "running"):
        raise ControllerError(f"drift check {check.check_id} {check.status}: {check.message}")


def _print_check(check: DriftCheck, fmt: str) -> None:
    if fmt != "table":
        emit_data(drift_check_data(check), fmt)
        return
    gbps = "{:.2f} GB/s".format
    rows = [
        ("kind", check.kind),
        ("status", check.status + (" (SIMULATED)" if check.simulated else "")),
        ("config version", check.config_version or "-"),
        (
            "reference",
            f"rollout {check.rollout_id} wave {check.wave}" if check.wave is not None else "-",
        ),
        ("reference busbw", "-" if check.reference_busbw_gbps is None else gbps(check.reference_busbw_gbps)),
        ("measured busbw", "-" if check.measured_busbw_gbps is None else gbps(check.measured_busbw_gbps)),
        ("change", _change(check)),
        ("threshold", "-" if check.threshold is None else f"-{check.threshold:.0%}"),
        ("p-value", "-" if check.p_value is None else f"{check.p_value:.2g} (alpha {check.alpha or 0:g})"),
        ("nodes", ", ".join(check.nodes) or "-"),
        ("benchmark jobs", ", ".join(check.job_ids) or "-"),
        ("study", check.study_id or "-"),
        ("message", check.message or "-"),
    ]
    emit_table(f"drift check {check.check_id}", ("FIELD", "VALUE"), rows)
