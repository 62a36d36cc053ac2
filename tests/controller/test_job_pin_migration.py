"""Upgrading a database whose job pins predate node orders: each pin becomes the job's own arm with an empty
order (answered in its nodes' computed order), reads back through the store, and a downgrade keeps it."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources

import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig

from topo_tune.controller.db.database import Database
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.jobs.config import JobPin

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _config(database: Database) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(resources.files("topo_tune.controller.db") / "migrations"))
    config.attributes["connection_url"] = database.url
    return config


async def test_an_old_pin_survives_the_upgrade_and_the_downgrade(database_url: str) -> None:
    database = Database(database_url, retry_for_s=5)
    config = _config(database)
    try:
        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.upgrade(config, "0012")
            table = sa.Table("job_pins", sa.MetaData(), autoload_with=connection)
            row = {"config_version": "cv-00000000000000aa", "nodes": ["b", "a"], "rollout_id": "", "created_at": AT}
            connection.execute(sa.insert(table).values(job_id="job-old", **row))
        database.migrate()
        store = RolloutStore(db=database, wall_clock=lambda: AT)
        assert await store.get_pin("job-old") == JobPin("job-old", "cv-00000000000000aa", ("b", "a"), (), "")
        arm = JobPin("job-old", "", ("a", "b"), ("a", "b"), "defaults")
        assert await store.pin(arm, rollout_id="") == arm, "a second arm of the same job"
        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.downgrade(config, "0012")
            back = connection.execute(sa.text("SELECT job_id, config_version FROM job_pins")).all()
        assert [tuple(r) for r in back] == [("job-old", "cv-00000000000000aa")], "the job's own pin, only"
    finally:
        database.close()
