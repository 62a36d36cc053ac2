"""State files are created 0600 and state directories 0700 whatever the umask; the config store is shared
read-only (jobs of every user read it) and never writable by others."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.agent.config_store_child import A
from topo_tune.agent.config_store import ConfigStore
from topo_tune.agent.journal import Journal
from topo_tune.controller.db.database import Database
from topo_tune.security.private_files import private_dir, private_sqlite
from topo_tune.v1 import agent_pb2


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def permissive_umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def test_the_controller_database_and_its_wal_and_shm_are_0600(permissive_umask: int, tmp_path: Path) -> None:
    path = tmp_path / "topo-tune.db"
    db = Database(f"sqlite:///{path}")
    try:
        db.migrate()
        with db.engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE probe (x INTEGER)"))
            connection.execute(sa.text("INSERT INTO probe VALUES (1)"))
        with db.engine.connect() as connection:  # open while we look: WAL and SHM exist now
            connection.execute(sa.text("SELECT x FROM probe")).all()
            files = {p.name: mode(p) for p in tmp_path.iterdir()}
    finally:
        db.close()
    assert {"topo-tune.db-wal", "topo-tune.db-shm"} <= set(files), files
    assert files == dict.fromkeys(files, 0o600), {name: oct(m) for name, m in files.items()}


def test_a_database_made_world_readable_before_is_narrowed(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    for name in ("old.db", "old.db-wal"):
        (tmp_path / name).touch()
        (tmp_path / name).chmod(0o644)
    private_sqlite(str(path))
    assert mode(path) == mode(tmp_path / "old.db-wal") == 0o600
    private_sqlite(":memory:")  # nothing to do, nothing created
    private_sqlite(str(tmp_path / "missing" / "x.db"))  # left to SQLite, whose error says why
    assert not (tmp_path / "missing").exists()


def test_the_agent_journal_and_state_directory_are_its_alone(permissive_umask: int, tmp_path: Path) -> None:
    state = tmp_path / "state"
    journal = Journal(state / "journal.sqlite3")
    try:
        journal.take("c1")
        journal.finish(agent_pb2.CommandResult(command_id="c1", status=agent_pb2.COMMAND_STATUS_SUCCEEDED))
        files = {p.name: mode(p) for p in state.iterdir()}
    finally:
        journal.close()
    assert mode(state) == 0o700
    assert "journal.sqlite3-wal" in files and files == dict.fromkeys(files, 0o600), files


def test_an_existing_state_directory_is_narrowed(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o755)
    assert mode(private_dir(tmp_path / "state")) == 0o700


def test_the_config_store_is_readable_by_jobs_and_writable_by_the_agent_alone(
    permissive_umask: int, tmp_path: Path
) -> None:
    store = ConfigStore(tmp_path / "config")
    store.apply(A.id, A.files)
    assert mode(store.root) == mode(store.versions) == mode(store.versions / A.id) == 0o755
    assert {mode(p) for p in (store.versions / A.id).iterdir()} == {0o644}
    assert mode(store.jobs_lock) == 0o644
