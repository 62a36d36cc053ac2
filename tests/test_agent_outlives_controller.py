"""Agents outlive whatever happens to the controller: 50 SIGKILLs of the controller process, at random moments
of its life (starting, agents registering, sessions heartbeating), and every agent process is still running
and registers with the next controller.

Real processes through the CLI. Each round restarts the controller on the same port and kills it again after
a random delay; every tenth round first waits until all agents are registered, so that kills also land on
established sessions whose writers are busy (heartbeats every 0.1 s), where grpc's "RPC already finished"
used to escape a session and end the agent.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import TOKEN, LocalCluster
from tests.support.waiting import wait_until
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ControllerError
from topo_tune.v1 import admin_pb2

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

KILLS = 50
AGENTS = ("n1", "n2", "n3")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(
        workdir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        heartbeat_interval=0.1,
        heartbeat_expiry=30,
    )
    try:
        yield local
    finally:
        local.stop()


def registered_since(cluster: LocalCluster, since: float) -> bool:
    """Every agent has a live session with the controller started at ``since`` (wall clock)."""
    try:
        with AdminClient(cluster.address, token=TOKEN, timeout_s=5) as client:
            nodes = client.list_nodes()
    except ControllerError:
        return False
    fresh = {
        n.name
        for n in nodes
        if n.state == admin_pb2.NODE_STATE_READY and n.registered_at.ToDatetime().timestamp() >= since - 1
    }
    return fresh == set(AGENTS)


def restart(cluster: LocalCluster) -> None:
    """Start the controller again and return once its port accepts connections (no CLI round trip)."""
    assert cluster.controller is not None
    cluster.controller.start()

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", cluster.port)) == 0

    wait_until(listening, timeout=120, interval=0.02, what="the controller's port")


def test_agents_outlive_50_controller_kills(cluster: LocalCluster) -> None:
    cluster.start_controller(timeout=120)
    agents = [cluster.start_agent(name) for name in AGENTS]
    wait_until(lambda: registered_since(cluster, 0), timeout=120, what="three registered agents")
    rng = random.Random(18)
    for kill in range(1, KILLS + 1):
        assert cluster.controller is not None
        cluster.controller.kill()
        dead = [name for name, agent in zip(AGENTS, agents, strict=True) if not agent.alive()]
        assert not dead, f"after controller kill {kill}, agents {dead} exited:\n{agents[0].output()[-3000:]}"
        started = time.time()
        restart(cluster)
        if kill % 10 == 0:
            wait_until(lambda s=started: registered_since(cluster, s), timeout=120, what=f"agents back (kill {kill})")
        time.sleep(rng.uniform(0.0, 0.4))
    started = time.time()
    assert cluster.controller is not None
    cluster.controller.kill()
    restart(cluster)
    wait_until(lambda: registered_since(cluster, started), timeout=120, what="agents back after the last kill")
    assert all(agent.alive() for agent in agents)
