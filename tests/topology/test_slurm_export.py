"""``topo-tune topology export --format slurm-*``: the tree form loaded by a real slurmctld, the block and yaml
forms checked against the grammar of Slurm's topology.conf(5) and topology.yaml(5), bandwidths from a real
controller's probe round over sim agents."""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.agent.test_daemon import agent_settings
from tests.support.processes import TOKEN
from tests.support.slurm_one_node import slurm_missing, slurm_one_node
from topo_tune.agent.daemon import Agent
from topo_tune.benchmark.probe_record import ProbeRequest, ProbeStatus
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.controller.server import Controller
from topo_tune.errors import ConfigError
from topo_tune.jobs.config import expand_hostlist
from topo_tune.nccl.backends import Backend
from topo_tune.topology.slurm_export import switch_tree

# Every real Slurm of the suite runs in one xdist group: one at a time, never two munge/slurmctld sets at once.
pytestmark = pytest.mark.xdist_group("real-slurm")

SPINE, BLOCK = "network.topology.nvidia.com/spine", "network.topology.nvidia.com/block"
CLUSTER_YAML = f"""apiVersion: topo-tune/v1
kind: Cluster
racks:
  - name: rack-a
    nodes:
      - {{name: tt-node1, labels: {{{SPINE}: spine-1, {BLOCK}: blk-1}}}}
      - {{name: tt-node2, labels: {{{SPINE}: spine-1, {BLOCK}: blk-1}}}}
  - name: rack-b
    nodes:
      - {{name: tt-node3, labels: {{{SPINE}: spine-1, {BLOCK}: blk-2}}}}
  - name: rack-c
    nodes:
      - {{name: tt-node4}}
"""
RACKS = {"rack-a": ["tt-node1", "tt-node2"], "rack-b": ["tt-node3"], "rack-c": ["tt-node4"]}


def export(form: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["topology", "export", "--format", form, *args], env={"TOPO_TUNE_TOKEN": TOKEN})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture
def cluster_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER_YAML)
    return path


def test_the_tree_is_loaded_by_a_real_slurmctld(cluster_yaml: Path, tmp_path: Path) -> None:
    missing = slurm_missing()
    assert not missing, f"{', '.join(missing)} not installed: `make slurm` installs Slurm and munge"
    conf = export("slurm-tree", "--cluster-config", str(cluster_yaml))
    assert "SwitchName=rack-a Nodes=tt-node1,tt-node2" in conf.splitlines()
    with slurm_one_node(
        tmp_path / "slurm",
        node="tt-node1",
        other_nodes=("tt-node2", "tt-node3", "tt-node4"),
        conf_lines=["TopologyPlugin=topology/tree"],
        topology_conf=conf,
    ) as slurm:
        shown = slurm.run("scontrol", "show", "topology")
    assert shown.returncode == 0, shown.stderr
    switches = {}
    for line in shown.stdout.splitlines():
        fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
        switches[fields["SwitchName"]] = (
            int(fields["Level"]),
            expand_hostlist(fields.get("Nodes", "")),
            expand_hostlist(fields.get("Switches", "")),
        )
    assert switches["rack-a"] == (0, ["tt-node1", "tt-node2"], [])
    assert switches["blk-1"][0] == 1 and switches["blk-1"][2] == ["rack-a"]
    assert switches["spine-1"][0] == 2 and sorted(switches["spine-1"][2]) == ["blk-1", "blk-2"]
    root = switches["root"]
    assert root[0] == 3 and sorted(root[2]) == ["rack-c", "spine-1"], "a root joins the spine and the bare rack"
    assert sorted(root[1]) == ["tt-node1", "tt-node2", "tt-node3", "tt-node4"], "every node under the root"


_BLOCK_LINE = re.compile(r"BlockName=(?P<name>[^\s=#,]+) Nodes=(?P<nodes>[^\s=#]+)")


def test_the_block_form_follows_topology_conf_5(cluster_yaml: Path) -> None:
    # topology.conf(5), topology/block: "BlockName=<name> Nodes=<hostlist>" per base block, optional
    # "BlockSizes=<n>[,<n>...]"; "#" starts a comment; every node in one block.
    blocks: dict[str, list[str]] = {}
    for line in export("slurm-block", "--cluster-config", str(cluster_yaml)).splitlines():
        if line.startswith("#"):
            continue
        match = _BLOCK_LINE.fullmatch(line)
        assert match, f"not a topology/block line: {line!r}"
        assert match["name"] not in blocks, "block names are unique"
        blocks[match["name"]] = expand_hostlist(match["nodes"])
    assert blocks == RACKS


def test_the_yaml_form_follows_topology_yaml_5(cluster_yaml: Path) -> None:
    text = export("slurm-yaml", "--cluster-config", str(cluster_yaml))
    topologies = yaml.safe_load(text)
    assert isinstance(topologies, list) and len(topologies) == 2
    assert sum(bool(t.get("cluster_default")) for t in topologies) == 1, "one cluster default"
    for topology in topologies:
        assert next(iter(topology)) == "topology", "the name must be the first attribute"
        assert len({"block", "flat", "tree"} & set(topology)) == 1, "exactly one topology type"
        assert set(topology) <= {"topology", "cluster_default", "block", "flat", "tree"}
    tree, block = (t for t in topologies if "tree" in t), (t for t in topologies if "block" in t)
    switches = {}
    for switch in next(tree)["tree"]["switches"]:
        assert next(iter(switch)) == "switch" and len({"children", "nodes"} & set(switch)) == 1, switch
        switches[switch["switch"]] = switch
    children = [c for s in switches.values() for c in expand_hostlist(s.get("children", ""))]
    assert set(children) <= set(switches) and len(children) == len(set(children)), "a tree of named switches"
    leaves = {name: expand_hostlist(s["nodes"]) for name, s in switches.items() if "nodes" in s}
    assert leaves == RACKS
    blocks = next(block)["block"]["blocks"]
    assert all(set(b) == {"block", "nodes"} for b in blocks)
    assert {b["block"]: expand_hostlist(b["nodes"]) for b in blocks} == RACKS


async def test_from_a_controller_each_switch_carries_its_slowest_measured_pair(
    controller: Controller, tmp_path: Path
) -> None:
    # The fixture's 1 s expiry is for tests about expiry; these agents share this test's event loop, which a busy
    # machine holds up for longer, and a node lost mid-round fails the round.
    controller.registry.expiry_s = 60.0
    address = f"127.0.0.1:{controller.port}"
    nodes = {"n1": ("rack-a", "blk-1"), "n2": ("rack-a", "blk-1"), "n3": ("rack-b", "blk-2")}
    stop, tasks = asyncio.Event(), []
    for name, (rack, block) in nodes.items():
        # gloo: a probe round measures real sendrecv between the agents' worker processes (sim nodes have no network).
        settings = replace(
            agent_settings(address, tmp_path / name, name),
            backend=Backend.GLOO,
            rack=rack,
            labels={SPINE: "spine-1", BLOCK: block},
        )
        agent = Agent(settings, rng=random.Random(0))
        tasks.append(asyncio.create_task(agent.run(stop)))
        await asyncio.wait_for(agent.registered.wait(), 30)
    try:
        with AdminClient(address, token=TOKEN) as client:
            request = ProbeRequest(message_bytes=1 << 16, pair_deadline_s=60)
            started = await asyncio.to_thread(client.start_probe_round, request)
            done = await asyncio.to_thread(client.wait_probe_round, started.round_id)
            assert done.status is ProbeStatus.SUCCEEDED, done.message
            measured = await asyncio.to_thread(client.measured_pairs)
        conf = await asyncio.to_thread(export, "slurm-tree", "--controller", address)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert len(measured) == 3, measured
    gbps = {frozenset((m.node_a, m.node_b)): m.bandwidth_gbps for m in measured}
    inside = gbps[frozenset(("n1", "n2"))]
    across = min(gbps[frozenset(("n1", "n3"))], gbps[frozenset(("n2", "n3"))])
    lines = conf.splitlines()
    assert f"# rack-a: slowest measured node pair across it {inside:.2f} GB/s (1 pair)" in lines
    assert f"# spine-1: slowest measured node pair across it {across:.2f} GB/s (2 pairs)" in lines
    assert "SwitchName=spine-1 Switches=blk-1,blk-2" in lines and "SwitchName=rack-b Nodes=n3" in lines
    assert not any(line.startswith("# rack-b:") for line in lines), "no pair inside rack-b: no bandwidth"
    assert "root" not in conf, "one top switch needs no root"


@pytest.mark.parametrize(
    ("rack_of", "tiers_of", "refused"),
    [
        ({"a": "r1", "b": ""}, {}, "rack: b has no rack"),
        ({"a": "r1", "b": "r1"}, {"a": ("s1",)}, "rack r1: b is under no tier, others under s1"),
        ({"a": "r1", "b": "s1"}, {"a": ("s1",)}, "'s1' names two switches"),
        ({"a": "r1", "b": "r2"}, {"a": ("s1", "x"), "b": ("s2", "x")}, "'x' is under both 's1' and 's2'"),
        ({"a b": "r1"}, {}, "'a b' (of node 'a b') is not a name Slurm's files can hold"),
        ({"a": "r1"}, {"a": ("s#1",)}, "'s#1'"),
    ],
)
def test_a_fabric_slurm_cannot_take_is_refused_by_name(
    rack_of: dict[str, str], tiers_of: dict[str, tuple[str, ...]], refused: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(refused)):
        switch_tree(rack_of, tiers_of)
