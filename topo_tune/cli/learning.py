"""``topo-tune admin learning``: production jobs teaching the tuner (``docs/learning.md``), as an admin sees it.

The cluster's switch is ``learning.enabled`` in cluster.yaml (read by ``controller serve``); this group holds
what is per version: its kill switch. A job opts out with ``TOPO_TUNE_LEARNING=off`` in its environment.
Non-goals: choosing a job's arm (the controller does, when the job is pinned).
"""

from __future__ import annotations

import click

from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data, emit_line
from topo_tune.cli.rollout import actor
from topo_tune.client.admin import AdminClient
from topo_tune.ids import ConfigVersionId


@admin.group("learning")
def learning() -> None:
    """Learning from production jobs: a version's kill switch (docs/learning.md).

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
