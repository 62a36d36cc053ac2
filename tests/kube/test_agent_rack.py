"""An agent in a pod without --rack registers with its Node's rack label, re-read on rediscovery."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

from tests.agent.test_daemon import CountingDiscovery, agent_settings
from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import FakeApiServer
from topo_tune.agent.daemon import Agent
from topo_tune.controller.server import Controller
from topo_tune.v1 import agent_pb2


async def test_the_rack_comes_from_the_node_label(
    controller: Controller, apiserver: FakeApiServer, kube_env: KubeEnvFactory, tmp_path: Path
) -> None:
    apiserver.add_node("n1", labels={"example.com/rack": "r7"})
    settings = dataclasses.replace(
        agent_settings(f"127.0.0.1:{controller.port}", tmp_path, "n1"),
        kubernetes=kube_env("agent"),
        rack_label="example.com/rack",
    )
    agent = Agent(settings, discover=CountingDiscovery(), rng=random.Random(1))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.registered.wait(), 20)
        assert (await controller.registry.get("n1")).rack == "r7"

        apiserver.add_node("n1", labels={"example.com/rack": "r8"})  # the node was relabelled
        result = await agent.executor.run(agent_pb2.Command(command_id="c1", rediscover=agent_pb2.Rediscover()))
        assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED
        assert agent.rack == "r8", "sent with the next registration"
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def test_an_explicit_rack_wins_and_a_failed_read_leaves_it_empty(
    apiserver: FakeApiServer, kube_env: KubeEnvFactory, tmp_path: Path
) -> None:
    apiserver.add_node("n1", labels={"topology.kubernetes.io/rack": "r7"})
    base = dataclasses.replace(agent_settings("127.0.0.1:1", tmp_path, "n1"), kubernetes=kube_env("agent"))
    explicit = Agent(dataclasses.replace(base, rack="fixed", state_dir=tmp_path / "a"), discover=CountingDiscovery())
    explicit.executor.discover()
    assert explicit.rack == "fixed"
    assert not apiserver.requests, "with --rack the API is not asked"

    apiserver.unreachable.add("agent")
    failed = Agent(dataclasses.replace(base, state_dir=tmp_path / "b"), discover=CountingDiscovery())
    failed.executor.discover()  # logs, never raises
    assert failed.rack == ""
    explicit.journal.close()
    failed.journal.close()


async def test_a_topograph_node_registers_its_lowest_tier_as_rack_and_the_tiers_above(
    controller: Controller, apiserver: FakeApiServer, kube_env: KubeEnvFactory, tmp_path: Path
) -> None:
    apiserver.add_node(
        "n1",
        labels={"network.topology.nvidia.com/block": "s1", "network.topology.nvidia.com/spine": "s2"},
    )
    settings = dataclasses.replace(
        agent_settings(f"127.0.0.1:{controller.port}", tmp_path, "n1"), kubernetes=kube_env("agent")
    )
    agent = Agent(settings, discover=CountingDiscovery(), rng=random.Random(1))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.registered.wait(), 20)
        node = await controller.registry.get("n1")
        assert node.rack == "s1"
        assert node.labels["network.topology.nvidia.com/spine"] == "s2", "the hierarchy reaches the controller"
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
