"""``topo-tune admin learning``: production jobs teaching the tuner (``docs/learning.md``), as an admin sees it.

The cluster's switch is ``learning.enabled`` in cluster.yaml (read by ``controller serve``); this group holds
what is per version: its kill switch, the evidence its learning jobs gave, and a challenger proposed as a new
version. A job opts out with ``TOPO_TUNE_LEARNING=off`` in its environment.
Non-goals: choosing a job's arm (the controller does, when the job is pinned).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data, emit_line, emit_table
from topo_tune.cli.rollout import actor
from topo_tune.client.admin import AdminClient
from topo_tune.ids import ConfigVersionId
from topo_tune.security.safe_write import write_file
from topo_tune.versions.version import MAX_CHALLENGERS

if TYPE_CHECKING:  # the evidence's module pulls in the statistics, which --help never needs
    from topo_tune.learning.version_evidence import VersionEvidence


@admin.group("learning")
def learning() -> None:
    """Learning from production jobs: kill switch, evidence, proposal (docs/learning.md).

    \b
    Off unless all three allow it: cluster.yaml's learning.enabled (default false), the version's
    kill switch (this group), and the job itself (TOPO_TUNE_LEARNING=off opts a job out).
    """


@learning.command("version")
@click.argument("version_id", metavar="ID")
@click.option(
    "--on/--off",
    "allowed",
    required=True,
    help="--off: every new job of the version runs its chosen table (jobs running keep their arm); --on: its "
    "jobs may explore its challengers again, when cluster.yaml's learning.enabled is true.",
)
@connected
def version(client: AdminClient, fmt: str, version_id: str, allowed: bool) -> None:
    """Set a config version's kill switch for learning; recorded as a version.learning event.

    \b
      topo-tune admin learning version cv-0123456789abcdef --off
    """
    stopped = client.set_version_learning(ConfigVersionId(version_id), stopped=not allowed, actor=actor())
    if fmt != "table":
        emit_data({"id": version_id, "learning_stopped": stopped}, fmt)
        return
    emit_line(f"{version_id}: learning {'stopped: new jobs run its chosen table' if stopped else 'allowed'}")


def evidence_data(found: VersionEvidence) -> dict[str, Any]:
    """The evidence as ``-o json`` prints it, and as the report's section takes it."""
    return {
        "id": found.version,
        "jobs_by_arm": {str(arm): n for arm, n in found.jobs_by_arm.items()},
        "divergent": list(found.divergent),
        "cells": [dataclasses.asdict(c) for c in found.cells],
        "proposable": list(found.proposable),
        "learning_stopped": found.learning_stopped,
        "learning_stopped_why": found.learning_stopped_why,
    }


@learning.command("evidence")
@click.argument("version_id", metavar="ID")
@click.option(
    "--report",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Also write it into this report.html's 'What learning jobs showed' section (init writes it empty).",
)
@connected
def evidence(client: AdminClient, fmt: str, version_id: str, report: Path | None) -> None:
    """What the version's learning jobs showed: each challenger against its chosen table per size class.

    \b
    A job is one sample (its ranks' timed calls pooled); a job whose ranks' records disagree on what ran
    is set aside and counted, and ranks that ran different choices stop the version's learning (its
    kill switch, shown with why; admin learning version ID --on allows it again). APPLIES: the
    challenger's table changes the chosen one's choices in that class (elsewhere both arms run the same
    choices). A challenger is proposable when it is faster in a class where it applies and shown
    non-inferior in every one: admin learning propose ID --arm N.
      topo-tune admin learning evidence cv-0123456789abcdef --report out/report.html  # into init's report
    """
    found = client.learning_evidence(ConfigVersionId(version_id))
    if report is not None:
        # Here, not at the top: the report's modules pull in matplotlib, which the table never needs.
        from topo_tune.tuner.report.learning_evidence import with_evidence  # noqa: PLC0415

        write_file(report, with_evidence(report.read_text(encoding="utf-8"), evidence_data(found), where="--report"))
        emit_line(f"# {report}: {found.version}'s evidence in 'What learning jobs showed'", err=True)
    if fmt != "table":
        emit_data(evidence_data(found), fmt)
        return
    jobs = ", ".join(f"arm {arm}: {n}" for arm, n in found.jobs_by_arm.items()) or "none"
    emit_line(f"{found.version}: jobs compared ({jobs}); {len(found.divergent)} set aside as divergent")
    for line in found.divergent[:10]:
        emit_line(f"  divergent: {line}")
    if found.learning_stopped:
        why = f" {found.learning_stopped_why}" if found.learning_stopped_why else ""
        emit_line(f"learning stopped{why}: new jobs run the chosen table")
    else:
        emit_line("learning allowed (kill switch not set)")
    rows = [
        (
            str(c.arm),
            c.collective,
            str(c.class_bytes),
            f"{c.speedup:.3f}",
            f"[{c.ci_low:.3f}, {c.ci_high:.3f}]",
            str(c.jobs),
            c.decision,
            "yes" if c.applies else "no",
        )
        for c in found.cells
    ]
    emit_table("challengers against the chosen table", ("ARM", "COLLECTIVE", "CLASS", "SPEEDUP", "CI", "JOBS",
               "DECISION", "APPLIES"), rows)  # fmt: skip
    proposable = ", ".join(map(str, found.proposable)) or "none"
    emit_line(f"proposable challengers: {proposable}")


@learning.command("propose")
@click.argument("version_id", metavar="ID")
@click.option("--arm", type=click.IntRange(1, MAX_CHALLENGERS), required=True, help="The challenger to propose.")
@connected
def propose(client: AdminClient, fmt: str, version_id: str, arm: int) -> None:
    """Store a challenger the evidence shows better as a new config version (refused otherwise).

    \b
    The new version is the old one with the challenger's table as its chosen table. Nothing changes until
    it is rolled out like any other version, through the rollout's gates and approval policy; running
    jobs keep their pinned config:
      topo-tune admin learning propose cv-0123456789abcdef --arm 1
      topo-tune admin rollout create NEW_ID
    """
    new = client.propose_learned_version(ConfigVersionId(version_id), arm, actor=actor())
    if fmt != "table":
        emit_data({"id": new, "learned_from": version_id, "arm": arm}, fmt)
        return
    emit_line(f"{new}: challenger {arm} of {version_id}; roll it out with: topo-tune admin rollout create {new}")
