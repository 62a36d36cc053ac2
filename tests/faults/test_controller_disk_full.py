"""The disk under the controller's SQLite database fills up: writes fail at once, naming the database and
saying the disk is full; reads go on being answered; once space returns, writes succeed and nothing is lost.

Also: a write held up by SQLite's lock (another process holds it) does not hold up reads, and the admin
client tells "cannot reach the controller" from "the controller answered: its database is full".
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import controller_settings
from tests.faults.figures import record
from tests.support.processes import TOKEN, free_port
from tests.support.tmpfs import SmallDisk, small_disk
from topo_tune.client.admin import AdminClient
from topo_tune.controller.server import Controller
from topo_tune.errors import ControllerDatabaseFull, ControllerDatabaseUnavailable, ControllerUnavailable

pytestmark = pytest.mark.faults

CONTENT_LINES = 200


def big_version() -> dict[str, str]:
    """A valid version of about 800 KB: comment lines of random hex, so every one has its own content id."""
    lines = [f"# {secrets.token_hex(2000)}" for _ in range(CONTENT_LINES)]
    return {"nccl.conf": "\n".join([*lines, "NCCL_MIN_NCHANNELS=4", ""])}


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with small_disk(tmp_path / "db", size_bytes=24 << 20) as mounted:
        yield mounted


async def fill_fail_and_recover(admin: AdminClient, disk: SmallDisk, *, database: str) -> tuple[list[str], str]:
    """Fill ``disk`` under a controller's database, then: writes fail at once naming ``database`` and saying it
    is full; reads are answered; once space returns the same write succeeds and every version stored before
    is there whole. Returns the ids stored and what the failed write said."""
    stored = [(await asyncio.to_thread(admin.put_config_version, big_version(), {"by": "test"})).id]
    await asyncio.to_thread(disk.fill)

    # Writes: the first one past the space the database still had fails, at once, with the database's name.
    failure: ControllerDatabaseFull | None = None
    for _ in range(60):
        files = big_version()
        started = time.monotonic()
        try:
            stored.append((await asyncio.to_thread(admin.put_config_version, files, {"by": "test"})).id)
        except ControllerDatabaseFull as error:
            failure, took = error, time.monotonic() - started
            break
    assert failure is not None, "the disk never filled"
    assert took < 3.0, f"a full disk is not retried: the write failed after {took:.1f} s"
    message = str(failure)
    assert "answered" in message and database in message and "is full" in message, message
    assert message.count("\n") == 0, message

    # Reads are answered while the disk is full, promptly; nothing half-written shows.
    started = time.monotonic()
    listed = await asyncio.to_thread(admin.list_config_versions)
    assert time.monotonic() - started < 3.0
    assert sorted(v.id for v in listed) == sorted(stored)
    await asyncio.to_thread(admin.list_nodes)

    # Space returns: the same write succeeds; nothing stored before was lost.
    disk.free()
    stored.append((await asyncio.to_thread(admin.put_config_version, files, {"by": "test"})).id)
    listed = await asyncio.to_thread(admin.list_config_versions)
    assert sorted(v.id for v in listed) == sorted(stored)
    for version_id in stored:
        got = await asyncio.to_thread(admin.get_config_version, version_id)
        assert got.files["nccl.conf"].count("\n") == CONTENT_LINES + 1
    return stored, message


async def test_a_full_disk_fails_writes_at_once_keeps_reads_and_recovers(disk: SmallDisk) -> None:
    path = disk.root / "controller.db"
    controller = Controller(controller_settings(f"sqlite:///{path}"))
    await controller.start()
    admin = AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN, timeout_s=10)
    try:
        stored, _ = await fill_fail_and_recover(admin, disk, database=str(path))
        record("controller SQLite disk full", faults=1, resumes=1, rows=len(stored))
    finally:
        admin.close()
        await controller.stop()


async def test_a_write_stuck_on_the_lock_does_not_hold_up_reads(tmp_path: Path) -> None:
    path = tmp_path / "controller.db"
    controller = Controller(controller_settings(f"sqlite:///{path}"))
    await controller.start()
    admin = AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN, timeout_s=10)
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        locker.execute("BEGIN IMMEDIATE")  # another process's write lock: the controller's writes wait
        write = asyncio.create_task(asyncio.to_thread(admin.put_config_version, big_version(), {"by": "test"}))
        await asyncio.sleep(0.5)  # the write is waiting on the lock meanwhile
        assert not write.done()
        started = time.monotonic()
        for _ in range(5):
            await asyncio.to_thread(admin.list_config_versions)
            await asyncio.to_thread(admin.list_nodes)
        assert time.monotonic() - started < 3.0, "reads queued behind the stuck write"
        assert not write.done()
        locker.execute("COMMIT")
        version = await asyncio.wait_for(write, 30)
        assert [v.id for v in await asyncio.to_thread(admin.list_config_versions)] == [version.id]
    finally:
        locker.close()
        admin.close()
        await controller.stop()


def test_the_client_tells_an_unreachable_controller_from_one_that_answered() -> None:
    with (
        AdminClient(f"127.0.0.1:{free_port()}", token=TOKEN, timeout_s=2) as admin,
        pytest.raises(ControllerUnavailable) as raised,
    ):
        admin.list_nodes()
    assert not isinstance(raised.value, ControllerDatabaseUnavailable)
    assert "is unreachable" in str(raised.value)
