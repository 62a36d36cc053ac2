"""Learning's switches: cluster.yaml's ``learning`` section (off by default) and a version's kill switch, set
through the CLI against a real controller, kept with the version and audited."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from tests.support.processes import TOKEN
from topo_tune.cli.main import cli
from topo_tune.config.cluster import LearningConfig, parse_cluster_config
from topo_tune.controller.db.models import EventRow
from topo_tune.controller.server import Controller
from topo_tune.errors import ConfigError
from topo_tune.learning.assignment import MAX_EXPLORE_SHARE
from topo_tune.versions.version import ConfigVersion


async def admin_cli(controller: Controller, *args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", *args, "--controller", f"127.0.0.1:{controller.port}"],
        env={"TOPO_TUNE_TOKEN": TOKEN},
        prog_name="topo-tune",
    )


def test_learning_is_off_unless_cluster_yaml_turns_it_on() -> None:
    assert parse_cluster_config({"apiVersion": "topo-tune/v1"}).learning == LearningConfig(enabled=False)
    on = parse_cluster_config({"apiVersion": "topo-tune/v1", "learning": {"enabled": True, "timingSample": 8}})
    assert on.learning.enabled and on.learning.timing_sample == 8
    with pytest.raises(ConfigError, match=r"learning\.exploreShare: input should be less than or equal to 0\.5"):
        parse_cluster_config({"apiVersion": "topo-tune/v1", "learning": {"exploreShare": 0.6}})
    with pytest.raises(ConfigError, match=r"learning\.exploring"):
        parse_cluster_config({"apiVersion": "topo-tune/v1", "learning": {"exploring": True}})
    bound = LearningConfig.model_json_schema()["properties"]["exploreShare"]["maximum"]
    assert bound == MAX_EXPLORE_SHARE, "cluster.yaml's bound is the draw's"


async def test_a_versions_kill_switch_is_kept_with_it_and_audited(controller: Controller) -> None:
    version = ConfigVersion({"nccl.conf": "NCCL_MIN_CTAS=16\n"})
    await controller.services.config_versions.store(version)

    shown = await admin_cli(controller, "config", "show", version.id)
    assert shown.exit_code == 0, shown.output
    assert "allowed" in shown.stdout

    stopped = await admin_cli(controller, "learning", "version", version.id, "--off")
    assert stopped.exit_code == 0, stopped.output
    assert "learning stopped" in stopped.stdout
    assert (await controller.services.config_versions.get(version.id)).learning_stopped
    assert version.id in [v.id for v in await controller.services.config_versions.list()], "the id is unchanged"
    shown = await admin_cli(controller, "config", "show", version.id, "-o", "json")
    assert '"learning_stopped": true' in shown.stdout

    again = await admin_cli(controller, "learning", "version", version.id, "--off")
    assert again.exit_code == 0, again.output
    allowed = await admin_cli(controller, "learning", "version", version.id, "--on")
    assert allowed.exit_code == 0 and "learning allowed" in allowed.stdout, allowed.output

    events = await controller.services.db.read(
        lambda s: [e.message for e in s.scalars(sa.select(EventRow).where(EventRow.kind == "version.learning"))]
    )
    assert len(events) == 2, "one event per change, none for setting what was set"
    assert events[0].startswith(f"learning stopped for {version.id} by ")
    assert events[1].startswith(f"learning allowed for {version.id} by ")

    unknown = await admin_cli(controller, "learning", "version", "cv-ffffffffffffffff", "--off")
    assert unknown.exit_code != 0 and "no config version 'cv-ffffffffffffffff'" in unknown.output
    bad = await admin_cli(controller, "learning", "version", "nope", "--off")
    assert bad.exit_code != 0 and "not a config version id" in bad.output
    neither = await admin_cli(controller, "learning", "version", version.id)
    assert neither.exit_code == 2 and "Missing option '--on'" in neither.output
