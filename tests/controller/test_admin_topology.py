"""`topo-tune admin topology` against a controller with a multi-node cluster of recorded machines."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc.aio
import yaml
from click.testing import CliRunner, Result

from tests.conftest import controller_settings
from tests.controller.test_services import open_session
from tests.support.processes import TOKEN
from tests.topology.conftest import replay
from topo_tune.cli.main import cli
from topo_tune.controller.server import Controller
from topo_tune.v1 import agent_pb2

NODES = {
    "hgx-01": ("hgx-h100-8nic", "rack-a"),
    "hgx-02": ("hgx-h100-8nic", "rack-a"),
    "pcie-01": ("pcie-2socket-8gpu", "rack-b"),
    "vm-01": ("h200-vm", "rack-b"),
}
TIERS = {"network.topology.nvidia.com/spine": "spine-1", "network.topology.nvidia.com/block": "blk-2"}
"""The tiers above rack-a, as its agents register them (Topograph's labels)."""


async def invoke(*args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke, cli, ["admin", "topology", *args], env={"TOPO_TUNE_TOKEN": TOKEN}, prog_name="topo-tune"
    )


async def test_admin_topology_shows_racks_and_node_matrices(tmp_path: Path, sqlite_url: str) -> None:
    controller = Controller(controller_settings(sqlite_url, spine_oversubscription=4.0))
    await controller.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            calls = []
            for name, (fixture, rack) in NODES.items():
                topology, _ = replay(fixture, tmp_path / name)
                topology.hostname = name
                register = agent_pb2.Register(
                    node_name=name,
                    rack=rack,
                    backend=agent_pb2.BACKEND_NCCL,
                    instance_id="i",
                    topology=topology,
                    labels=TIERS if rack == "rack-a" else {},
                )
                call = await open_session(channel, agent_pb2.AgentMessage(register=register))
                await call.read()
                calls.append(call)
            address = f"127.0.0.1:{controller.port}"

            racks = await invoke("--controller", address)
            assert racks.exit_code == 0, racks.output
            assert "Rack rack-a (2 nodes, under spine-1/blk-2)" in racks.output
            assert "Rack rack-b (2 nodes)" in racks.output
            for name in NODES:
                assert name in racks.output

            matrix = await invoke("hgx-01", "--controller", address)
            assert matrix.exit_code == 0, matrix.output
            assert "NV18" in matrix.output
            assert "Rack rack-a" in matrix.output

            vm = await invoke("vm-01", "--controller", address)
            assert "unknown" in vm.output.lower()

            as_json = await invoke("--controller", address, "--output", "json")
            data = json.loads(as_json.stdout)
            assert {n for rack in data["racks"] for n in rack["nodes"]} == set(NODES)
            assert data["spine"]["oversubscription"] == 4.0
            assert [r.get("tiers") for r in data["racks"]] == [[["spine-1", "blk-2"]], None]
            one = yaml.safe_load((await invoke("hgx-01", "--controller", address, "-o", "yaml")).output)
            assert one["rack"] == "rack-a" and one["topology"]["gpu_links"][0]["kind"] in ("self", "nvlink")
            assert isinstance(one["topology"]["memory_bytes"], int)

            missing = await invoke("ghost", "--controller", address)
            assert missing.exit_code == 1
            assert "unknown node 'ghost'" in missing.output
            for call in calls:
                call.cancel()
    finally:
        await controller.stop()
