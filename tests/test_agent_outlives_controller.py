"""Agents outlive whatever happens to the controller: SIGKILLs of the controller process at every point of its
life that an agent can tell apart, and every agent process is still running and registers with the next
controller.

Real processes through the CLI. Each round restarts the controller on the same port and kills it at one of
these points, in rotation, four times each (so every point also follows every other one):

- ``starting``: the interpreter is still importing, the port is closed: the agents' dials are refused;
- ``listening``: the port has just opened: the agents are in back-off or dialling, a ``Register`` in flight;
- ``registering``: the first agent has a session with this controller, the others may still be registering;
- ``serving``: every agent is registered and heartbeating every 0.1 s, so the kill lands on established
  sessions whose writers are busy (where grpc's "RPC already finished" used to escape a session and end the
  agent), at a random moment of the heartbeat cycle.

The points are chosen rather than drawn at random: a random delay after the port opens mostly lands on agents
still in back-off, and each kill costs a controller start (an interpreter and its imports).
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.processes import TOKEN, LocalCluster
from tests.support.waiting import wait_until
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ControllerError
from topo_tune.node_record import NodeState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

KILL_POINTS = ("starting", "listening", "registering", "serving")
ROUNDS = 4
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


def registered_since(cluster: LocalCluster, since: float) -> set[str]:
    """The agents with a live session with the controller started at ``since`` (wall clock)."""
    try:
        with AdminClient(cluster.address, token=TOKEN, timeout_s=5) as client:
            nodes = client.list_nodes()
    except ControllerError:
        return set()
    return {
        n.name
        for n in nodes
        if n.state is NodeState.READY and n.registered_at is not None and n.registered_at.timestamp() >= since - 1
    }


def listening(cluster: LocalCluster) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", cluster.port)) == 0


def reach(point: str, cluster: LocalCluster, *, started: float, rng: random.Random) -> None:
    """Return when the controller started at ``started`` is at ``point`` of its life."""
    waits: dict[str, Callable[[], bool]] = {
        "listening": lambda: listening(cluster),
        "registering": lambda: bool(registered_since(cluster, started)),
        "serving": lambda: registered_since(cluster, started) == set(AGENTS),
    }
    if point == "starting":
        time.sleep(rng.uniform(0.0, 0.3))  # well inside the interpreter's start: its imports take longer
        assert not listening(cluster), "the controller was already listening: not a kill while starting"
        return
    wait_until(waits[point], timeout=120, interval=0.02, what=f"the controller {point}")
    if point == "serving":
        time.sleep(rng.uniform(0.0, 0.3))  # anywhere in the 0.1 s heartbeat cycle, a few heartbeats in


def test_agents_outlive_controller_kills_at_every_point_of_its_life(cluster: LocalCluster) -> None:
    cluster.start_controller(timeout=120)
    agents = [cluster.start_agent(name) for name in AGENTS]
    wait_until(lambda: registered_since(cluster, 0) == set(AGENTS), timeout=120, what="three registered agents")
    rng = random.Random(18)
    for kill, point in enumerate(KILL_POINTS * ROUNDS, start=1):
        assert cluster.controller is not None
        cluster.controller.kill()
        dead = [name for name, agent in zip(AGENTS, agents, strict=True) if not agent.alive()]
        assert not dead, f"after controller kill {kill}, agents {dead} exited:\n{agents[0].output()[-3000:]}"
        started = time.time()
        cluster.controller.start()
        reach(point, cluster, started=started, rng=rng)
    started = time.time()
    assert cluster.controller is not None
    cluster.controller.kill()
    cluster.controller.start()
    wait_until(lambda: registered_since(cluster, started) == set(AGENTS), timeout=120, what="agents back at the end")
    assert all(agent.alive() for agent in agents)
