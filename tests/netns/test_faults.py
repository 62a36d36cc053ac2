"""Faults on a namespace cluster with real agents: a cut link, a killed controller, a restarted database.

Each scenario checks what an operator would see through ``topo-tune admin``: node states, registrations,
and commands that run exactly once however the fault fell.
"""

from __future__ import annotations

import pytest

from tests.netns.conftest import ClusterFactory
from tests.support.liveness import assert_lost_after_the_expiry
from tests.support.netns import ClusterShape, NetnsCluster
from tests.support.postgres import PostgresServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.netns

SHAPE = ClusterShape(racks={"r1": ["a", "b"], "r2": ["c"]}, rack_mbit=400, spine_mbit=100)
READY = "ready"
LOST = "lost"
SUCCEEDED = "succeeded"


def commands(cluster: NetnsCluster) -> dict[str, dict[str, object]]:
    listed = cluster.admin_json("commands")
    assert isinstance(listed, list)
    return {str(c["command_id"]): c for c in listed}


def rediscover_everywhere(cluster: NetnsCluster, tag: str) -> list[str]:
    ids = [f"{tag}-{host}" for host in cluster.shape.hosts]
    for host, command_id in zip(cluster.shape.hosts, ids, strict=True):
        cluster.admin_json("rediscover", host, "--id", command_id)
    return ids


def all_succeeded_once(cluster: NetnsCluster, ids: list[str]) -> bool:
    listed = commands(cluster)
    return all((listed[i]["status"], listed[i]["deliveries"]) == (SUCCEEDED, 1) for i in ids)


def test_a_cut_agent_link_makes_the_node_lost_and_back_and_a_killed_controller_gets_every_agent_back(
    make_cluster: ClusterFactory, sqlite_url: str
) -> None:
    cluster = make_cluster(SHAPE)
    cluster.start_controller(sqlite_url)
    cluster.start_agents()

    cluster.set_link("controller", "b", up=False)
    wait_until(lambda: cluster.node_states()["b"] == LOST, what="b lost", timeout=20, interval=0.2)
    assert cluster.controller is not None
    assert_lost_after_the_expiry(cluster.controller, cluster.nodes, "b", expiry_s=cluster.heartbeat_expiry)
    assert cluster.node_states() == {"a": READY, "b": LOST, "c": READY}
    # A command for the cut-off node waits for it; the agent itself kept running all along.
    cluster.admin_json("rediscover", "b", "--id", "while-cut")
    assert cluster.agents["b"].alive()

    cluster.set_link("controller", "b", up=True)
    wait_until(lambda: cluster.node_states()["b"] == READY, what="b ready again", timeout=40, interval=0.2)
    wait_until(lambda: all_succeeded_once(cluster, ["while-cut"]), what="the waiting command", timeout=30)
    assert cluster.agents["b"].output().count("executing command while-cut") == 1

    # The same cluster: the controller SIGKILLed and restarted in its namespace.
    before = ["while-cut", *rediscover_everywhere(cluster, "before")]
    wait_until(lambda: all_succeeded_once(cluster, before), what="commands before the kill")
    registrations = {name: int(str(n["registrations"])) for name, n in cluster.nodes().items()}
    assert cluster.controller is not None
    cluster.controller.kill()
    cluster.start_controller(sqlite_url)
    wait_until(
        lambda: (
            {name: (n["state"], n["registrations"]) for name, n in cluster.nodes().items()}
            == {name: (READY, count + 1) for name, count in registrations.items()}
        ),
        what="every agent to re-register by itself",
        timeout=60,
        interval=0.3,
    )
    after = rediscover_everywhere(cluster, "after")
    wait_until(lambda: all_succeeded_once(cluster, after), what="commands after the restart")
    assert sorted(commands(cluster)) == sorted(before + after), "no command lost or duplicated"
    for host in SHAPE.hosts:
        assert cluster.agents[host].alive()


@pytest.mark.postgres
def test_postgres_restarted_under_the_controller_loses_and_duplicates_nothing(
    make_cluster: ClusterFactory, postgres: PostgresServer
) -> None:
    cluster = make_cluster(SHAPE)
    # The controller's namespace cannot reach the server's 127.0.0.1; its Unix socket is a file path.
    cluster.start_controller(postgres.unix_socket_url(postgres.new_database()))
    cluster.start_agents()
    before = rediscover_everywhere(cluster, "before")
    wait_until(lambda: all_succeeded_once(cluster, before), what="commands before the restart")

    postgres.restart()  # every pooled connection of the controller breaks

    during = rediscover_everywhere(cluster, "after")
    wait_until(lambda: all_succeeded_once(cluster, during), what="commands after the restart")
    nodes = cluster.nodes()
    assert sorted(nodes) == sorted(SHAPE.hosts)
    assert all((n["state"], n["registrations"]) == (READY, 1) for n in nodes.values()), nodes
    assert sorted(commands(cluster)) == sorted(before + during)
    assert cluster.controller is not None and cluster.controller.alive()
