"""ApplyConfig end to end: controller → agent → config store, and the version reported back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from tests.agent.config_store_child import A, B
from tests.agent.test_daemon import CountingDiscovery, RunningAgent, _finished, address, start_agent
from tests.conftest import controller_settings
from tests.support.waiting import async_wait_until
from topo_tune.command_record import CommandStatus
from topo_tune.controller.server import Controller
from topo_tune.v1 import agent_pb2
from topo_tune.versions.version import version_id

__all__ = ["start_agent"]  # the fixture, re-used from the daemon tests


@pytest.fixture
async def controller(sqlite_url: str) -> AsyncIterator[Controller]:
    """A controller whose rollout pass never runs during a test: these tests apply versions by hand, and with
    no rollout active the pass would hold the node on the stable version (NCCL's defaults) under them."""
    server = Controller(controller_settings(sqlite_url, rollout_interval_s=3600.0))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _apply(controller: Controller, version: str, files: dict[str, str], command_id: str) -> object:
    command = agent_pb2.Command(apply_config=agent_pb2.ApplyConfig(version=version, files=files))
    record = await controller.commands.submit("n1", command, command_id=command_id)
    await controller.hub.deliver_new(record)
    return await async_wait_until(lambda: _finished(controller, record.id), what=f"{command_id} to finish")


async def _reports(controller: Controller, version: str) -> bool:
    return (await controller.registry.get("n1")).applied_config_version == version


async def test_apply_config_activates_and_reports_the_version(
    controller: Controller, start_agent: Callable[..., RunningAgent]
) -> None:
    running = start_agent(address(controller), CountingDiscovery())
    await asyncio.wait_for(running.agent.registered.wait(), 20)

    done = await _apply(controller, A.id, dict(A.files), "apply-a")
    assert done.status is CommandStatus.SUCCEEDED, done.message  # type: ignore[attr-defined]
    await async_wait_until(lambda: _reports(controller, A.id), what="the heartbeat to report A")
    store = running.agent.config_store
    assert (store.root / "active" / "nccl.conf").read_text() == A.files["nccl.conf"]

    again = await _apply(controller, A.id, dict(A.files), "apply-a-again")
    assert again.status is CommandStatus.SUCCEEDED and "already active" in again.message  # type: ignore[attr-defined]

    bad_files = {"nccl.conf": "LD_PRELOAD=/tmp/evil.so\n"}
    bad = await _apply(controller, version_id(bad_files), bad_files, "apply-bad")
    assert bad.status is CommandStatus.REJECTED and "LD_PRELOAD" in bad.message  # type: ignore[attr-defined]
    assert store.active_version() == A.id

    deep = {**A.files, "rankmap.json": "[" * 100_000 + "]" * 100_000}  # sent by a controller that did not check
    refused = await _apply(controller, version_id(deep), deep, "apply-deep")
    assert refused.status is CommandStatus.REJECTED, refused.message  # type: ignore[attr-defined]
    assert "rankmap.json" in refused.message and "nested more than 8 levels" in refused.message  # type: ignore[attr-defined]
    assert store.active_version() == A.id
    assert version_id(deep) not in store.staged(), "nothing staged"

    await _apply(controller, B.id, dict(B.files), "apply-b")
    await async_wait_until(lambda: _reports(controller, B.id), what="the heartbeat to report B")
    await running.shutdown()

    # A restarted agent registers with the version that is active on disk.
    restarted = start_agent(address(controller), CountingDiscovery())
    await asyncio.wait_for(restarted.agent.registered.wait(), 20)
    assert (await controller.registry.get("n1")).applied_config_version == B.id
    await restarted.shutdown()
