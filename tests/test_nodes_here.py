"""Which nodes of cluster.yaml are this machine (init runs their agents), the line for the others, the token file."""

from __future__ import annotations

import os
import shlex
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from topo_tune.cli.local_cluster import ThisHost, agent_command, nodes_here, token_file_for
from topo_tune.config.cluster import ClusterConfig, parse_cluster_config
from topo_tune.errors import ConfigError
from topo_tune.nccl.backends import Backend
from topo_tune.node_record import NodeInfo, NodeState
from topo_tune.tuning_pass.run import last_heard

HOST = ThisHost(names=frozenset({"gpu-07.example.net", "gpu-07", "localhost"}), addresses=frozenset({"10.1.2.7"}))


def cluster(backend: str, *nodes: dict[str, Any]) -> ClusterConfig:
    return parse_cluster_config(
        {"apiVersion": "topo-tune/v1", "backend": backend, "racks": [{"name": "r", "nodes": list(nodes)}]}
    )


def test_the_only_nccl_node_is_this_machine_whatever_its_name() -> None:
    assert nodes_here(cluster("nccl", {"name": "gpu-box"}), HOST) == (("gpu-box",), ())


def test_of_several_nccl_nodes_the_one_named_by_this_host_is_here() -> None:
    found = nodes_here(cluster("nccl", {"name": "gpu-06"}, {"name": "GPU-07"}, {"name": "gpu-08"}), HOST)
    assert found == (("GPU-07",), ("gpu-06", "gpu-08"))
    assert nodes_here(cluster("nccl", {"name": "gpu-06"}, {"name": "gpu-08"}), HOST) == ((), ("gpu-06", "gpu-08"))


@pytest.mark.parametrize("address", ["10.1.2.7", "gpu-07", "gpu-07.example.net:5000", "127.0.0.1", "[::1]:29500"])
def test_a_node_whose_address_is_this_machine_is_here(address: str) -> None:
    found = nodes_here(cluster("nccl", {"name": "a", "address": address}, {"name": "b"}), HOST)
    assert found == (("a",), ("b",))


def test_an_address_elsewhere_wins_over_being_the_only_node_or_gloo() -> None:
    assert nodes_here(cluster("nccl", {"name": "gpu-07", "address": "10.1.2.8"}), HOST) == ((), ("gpu-07",))
    gloo = cluster("gloo", {"name": "c1"}, {"name": "c2"}, {"name": "far", "address": "192.0.2.1"})
    assert nodes_here(gloo, HOST) == (("c1", "c2"), ("far",)), "unaddressed gloo nodes are stand-ins run here"
    sim = cluster("sim", {"name": "s1", "address": "192.0.2.1"}, {"name": "s2"})
    assert nodes_here(sim, HOST) == (("s1", "s2"), ()), "sim nodes are all simulated here"


def test_two_nccl_nodes_on_this_machine_are_refused() -> None:
    with pytest.raises(ConfigError, match="gpu-07 and b are both this machine"):
        nodes_here(cluster("nccl", {"name": "gpu-07"}, {"name": "b", "address": "127.0.0.1"}), HOST)


def test_the_agent_line_carries_everything_the_node_needs() -> None:
    node = cluster(
        "nccl",
        {
            "name": "gpu-08",
            "address": "10.1.2.8",
            "workerEnv": {"NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_BLOCKING_WAIT": "1"},
        },
    )
    line = agent_command(
        node.racks[0].nodes[0],
        rack="r",
        backend=Backend.NCCL,
        controller="gpu-07:50051",
        token_file=Path("/srv/out dir/.topo-tune/agent-token"),
    )
    assert shlex.split(line) == [
        *("topo-tune", "agent", "run", "--controller", "gpu-07:50051"),
        *("--token-file", "/srv/out dir/.topo-tune/agent-token", "--node-name", "gpu-08", "--rack", "r"),
        *("--backend", "nccl", "--address", "10.1.2.8"),
        *("--worker-env", "NCCL_NVLS_ENABLE=0", "--worker-env", "TORCH_NCCL_BLOCKING_WAIT=1"),
    ]


def test_the_token_file_is_private_and_kept_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "state" / "agent-token"
    token = token_file_for(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == token and len(token) == 32
    assert token_file_for(path) == token, "a resumed init keeps the token its agents hold"
    os.chmod(path, 0o644)
    replaced = token_file_for(path)
    assert replaced != token, "a token others could read is not reused"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == replaced
    assert [p.name for p in path.parent.iterdir()] == ["agent-token"], "no partial file left"


def test_what_was_last_heard_from_a_node_that_is_not_ready() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    lost = NodeInfo("n", "r", NodeState.LOST, "gloo", registrations=2, last_heartbeat_at=now - timedelta(seconds=14))
    assert last_heard(lost, now.timestamp()) == "lost: last heartbeat 14 s ago, 2 registrations"
    unheard = NodeInfo("n", "r", NodeState.LOST, "gloo", registrations=1)
    assert last_heard(unheard, now.timestamp()) == "lost: no heartbeat recorded, 1 registrations"
    assert last_heard(None, now.timestamp()) == "never registered"
