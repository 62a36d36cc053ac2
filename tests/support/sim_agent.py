"""One ``sim`` agent in this process, connected to an in-process controller until the block ends."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support.processes import TOKEN
from topo_tune.agent.daemon import Agent
from topo_tune.agent.settings import AgentSettings
from topo_tune.nccl.backends import Backend
from topo_tune.sim.node_topology import simulated_node_topology


@asynccontextmanager
async def sim_agent(
    port: int,
    root: Path,
    *,
    node: str = "gpu1",
    rack: str = "rack-1",
    profile: str = "h100-nvswitch",
    config_dir: Path | None = None,
    address: str = "",
) -> AsyncIterator[Agent]:
    """A registered agent whose state and config directories are ``root/state`` and ``root/config`` (so an agent
    started again on the same ``root`` is the same node coming back); ``config_dir`` gives several agents one
    config directory (one path on every node, as gate jobs expect)."""
    settings = AgentSettings(
        controller=f"127.0.0.1:{port}",
        node_name=node,
        token=TOKEN,
        rack=rack,
        backend=Backend.SIM,
        address=address,
        state_dir=root / "state",
        config_dir=config_dir or root / "config",
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    agent = Agent(settings, rng=random.Random(0), discover=lambda: simulated_node_topology(node, profile=profile))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await asyncio.wait_for(agent.registered.wait(), 20)
    try:
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
