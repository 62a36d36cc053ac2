"""Shared fixtures: databases (SQLite and a throwaway PostgreSQL), in-process controllers on port 0; and how the
suite is spread over pytest-xdist workers (``make test`` runs it in parallel; docs/testing.md has the rules).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.parallel import schedule_for_workers
from tests.support.postgres import PostgresServer
from tests.support.processes import TOKEN
from topo_tune.controller.server import Controller
from topo_tune.controller.settings import ControllerSettings


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook: schedule_for_workers says why
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker; a plain run keeps the files' order
        schedule_for_workers(items)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every persistence test runs on both backends."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'topo-tune.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'topo-tune.db'}"


def controller_settings(database_url: str, **overrides: object) -> ControllerSettings:
    values: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "database_url": database_url,
        "token": TOKEN,
        "heartbeat_interval_s": 0.2,
        "heartbeat_expiry_s": 1.0,
        "shutdown_grace_s": 0.5,
    }
    values.update(overrides)
    return ControllerSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def controller(sqlite_url: str) -> AsyncIterator[Controller]:
    """A real controller (gRPC on loopback, SQLite) in this process."""
    server = Controller(controller_settings(sqlite_url))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
