"""A controller with learning on and a version carrying one challenger rolled out to one sim agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import controller_settings
from tests.controller.rollout.fleet import SimVerifier
from tests.learning.test_candidates import CHALLENGER_TABLE, CHOSEN_TABLE
from tests.support.rolled_out import roll_out
from tests.support.sim_agent import sim_agent
from topo_tune.config.cluster import LearningConfig
from topo_tune.controller.server import Controller
from topo_tune.versions.version import TUNER_TABLE, ConfigVersion, challenger_table, render_nccl_conf

NODE = "learn-n1"
LEARNING = ConfigVersion(
    {
        "nccl.conf": render_nccl_conf({"NCCL_MIN_CTAS": "16"}),
        TUNER_TABLE: CHOSEN_TABLE,
        challenger_table(1): CHALLENGER_TABLE,
    }
)


@dataclass(frozen=True)
class LearningCluster:
    controller: Controller
    address: str
    config_dir: Path
    """The node's config directory, where the agent staged the version (every file, challengers included)."""


@asynccontextmanager
async def learning_cluster(
    database_url: str, root: Path, *, learning: LearningConfig, version: ConfigVersion = LEARNING
) -> AsyncIterator[LearningCluster]:
    server = Controller(controller_settings(database_url, heartbeat_expiry_s=10.0, learning=learning))
    await server.start()
    address = f"127.0.0.1:{server.port}"
    config_dir = root / "node-config"
    try:
        async with sim_agent(server.port, root / "agent", node=NODE, config_dir=config_dir):
            server.rollouts.verifier = SimVerifier({NODE: "rack-1"})
            await roll_out(address, version)
            yield LearningCluster(server, address, config_dir)
    finally:
        await server.stop()
