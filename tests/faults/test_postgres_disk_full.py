"""The disk under PostgreSQL's data directory fills up under a running controller: writes fail at once, naming
the database and saying its disk is full; reads go on being answered; once space returns, writes succeed and
nothing is lost.

The server's WAL lives on a disk of its own with room to spare, as production servers usually have it: with
the WAL on the full disk too, PostgreSQL stops itself (PANIC) when it cannot write a WAL segment, which is an
outage (``test_postgres_outage.py``), not a full disk the controller can report. Here a table that cannot
grow fails its statement with ``could not extend file …: No space left on device`` (SQLSTATE 53100), and the
server stays up.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import controller_settings
from tests.faults.figures import record
from tests.faults.test_controller_disk_full import fill_fail_and_recover
from tests.support.postgres import PostgresServer
from tests.support.processes import TOKEN
from tests.support.tmpfs import SmallDisk, small_disk
from topo_tune.client.admin import AdminClient
from topo_tune.controller.server import Controller

pytestmark = [pytest.mark.faults, pytest.mark.postgres]


@pytest.fixture
def server_on_a_small_disk() -> Iterator[tuple[PostgresServer, SmallDisk]]:
    # Not under pytest's tmp_path: the server runs as the postgres user, who may not enter it.
    base = Path(tempfile.mkdtemp(prefix="topo-tune-pg-disk-"))
    shutil.chown(base, "postgres", "postgres")
    wal = base / "wal"
    wal.mkdir()
    try:
        with small_disk(base / "pgdata", size_bytes=64 << 20) as disk:
            server = PostgresServer.start(root=disk.root, wal_dir=wal)
            try:
                yield server, disk
            finally:
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def server_alive(url: str) -> bool:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


async def test_a_full_disk_under_postgres_fails_writes_at_once_keeps_reads_and_recovers(
    server_on_a_small_disk: tuple[PostgresServer, SmallDisk],
) -> None:
    postgres, disk = server_on_a_small_disk
    url = postgres.new_database()
    controller = Controller(controller_settings(url))
    await controller.start()
    admin = AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN, timeout_s=10)
    try:
        stored, said = await fill_fail_and_recover(admin, disk, database=url.rsplit("/", 1)[1])
        assert "could not extend file" in said and "No space left on device" in said, said
        assert server_alive(url), "PostgreSQL kept running: its WAL is on another disk"
        record("controller PostgreSQL disk full", faults=1, resumes=1, rows=len(stored))
    finally:
        admin.close()
        await controller.stop()
