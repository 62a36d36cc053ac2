"""An embedded controller and, for local clusters, its agents, all in this process.

``topo-tune init`` needs a controller (unless ``cluster.yaml`` names a remote one) and, for a ``sim`` or a
local ``gloo`` cluster, agents for the nodes the file lists. This module starts them on loopback with a
fresh token, over real gRPC, exactly as the daemons would run: the tuning pass talks to the controller
through the admin API either way. Agents for ``nccl`` nodes (and any remote node) are the operator's to
start; the pass waits for them to register.

Non-goal: production deployment (that is ``topo-tune controller serve`` / ``agent run`` or the Helm chart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from topo_tune.agent.daemon import Agent
from topo_tune.agent.settings import AgentSettings
from topo_tune.cluster_config import ClusterConfig
from topo_tune.controller.server import Controller
from topo_tune.controller.settings import ControllerSettings
from topo_tune.sim.node_topology import simulated_node_topology

logger = logging.getLogger(__name__)


@dataclass
class EmbeddedCluster:
    cluster: ClusterConfig
    workdir: Path
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    controller: Controller | None = None
    agents: dict[str, tuple[Agent, asyncio.Event, asyncio.Task[None]]] = field(default_factory=dict)

    @property
    def address(self) -> str:
        assert self.controller is not None, "start() first"
        return f"127.0.0.1:{self.controller.port}"

    @property
    def database_url(self) -> str:
        section = self.cluster.controller
        default = type(section).model_fields["database"].default
        return section.database if section.database != default else f"sqlite:///{self.workdir / 'topo-tune.db'}"

    async def start(self, *, local_agents: bool) -> None:
        """Start the controller; with ``local_agents``, one agent per node of cluster.yaml."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        spine = self.cluster.spine
        self.controller = Controller(
            ControllerSettings(
                listen="127.0.0.1:0",
                database_url=self.database_url,
                token=self.token,
                heartbeat_interval_s=1.0,
                heartbeat_expiry_s=10.0,
                rack_of=self.cluster.rack_of(),
                spine_oversubscription=spine.oversubscription if spine else None,
                spine_bandwidth_gbps=spine.bandwidth_gbps if spine else None,
                spine_ecmp_paths=spine.ecmp_paths if spine else 1,
                benchmark_result_grace_s=5.0,
                shutdown_grace_s=1.0,
            )
        )
        await self.controller.start()
        if local_agents:
            for rack in self.cluster.racks:
                for node in rack.nodes:
                    self._start_agent(node.name, rack.name, node.gpus, node.address or "127.0.0.1")

    def _start_agent(self, name: str, rack: str, gpus: int, address: str) -> None:
        backend = self.cluster.backend
        settings = AgentSettings(
            controller=self.address,
            node_name=name,
            token=self.token,
            rack=rack,
            backend=backend,
            address=address,
            state_dir=self.workdir / "agents" / name,
            config_dir=self.workdir / "agents" / name / "config",
            backoff_initial_s=0.2,
            backoff_max_s=2.0,
            sim_gpus=max(1, gpus),
        )
        if backend == "sim":
            agent = Agent(settings, discover=lambda: simulated_node_topology(name, gpus=max(1, gpus)))
        else:
            agent = Agent(settings)
        stop = asyncio.Event()
        self.agents[name] = (agent, stop, asyncio.create_task(agent.run(stop), name=f"agent-{name}"))

    async def stop(self) -> None:
        for _, stop, _ in self.agents.values():
            stop.set()
        for _, _, task in self.agents.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        self.agents.clear()
        if self.controller is not None:
            await self.controller.stop()
            self.controller = None
