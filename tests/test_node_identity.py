"""Which node a job's rank runs on: ``--node``, ``$TOPO_TUNE_NODE_NAME``, Slurm's ``$SLURMD_NODENAME``, then the
name this host's agent recorded in the config directory, then the host name. A config directory shared by
several agents (one path on every host, or the demo's agents on one machine) never gives a host another
host's name, so never two hosts one rank."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import cli_env
from topo_tune.agent.config_store import ConfigStore
from topo_tune.cli.job import this_node
from topo_tune.controller.server import Controller
from topo_tune.errors import ConfigError
from topo_tune.versions import node_names

HOST = socket.gethostname()


def _record(config_dir: Path, host: str, name: str) -> None:
    ConfigStore(config_dir).record_node_name(name, host=host)


def test_agents_sharing_a_config_directory_each_keep_their_hosts_line(tmp_path: Path) -> None:
    for host, name in (("host-a", "gpu01"), ("host-b", "gpu02"), ("host-a", "gpu01")):
        _record(tmp_path, host, name)
    assert (tmp_path / "node-name").read_text() == "host-a gpu01\nhost-b gpu02\n"
    assert node_names.recorded_name(tmp_path, "host-a") == "gpu01"
    assert node_names.recorded_name(tmp_path, "host-b") == "gpu02"
    assert node_names.recorded_name(tmp_path, "host-c") == "", "a host without a line: none"


WRITER = """
import sys
from pathlib import Path
from topo_tune.versions import node_names
for name in range(20):
    node_names.record(Path(sys.argv[1]), host=sys.argv[2], name=f"gpu{name:02d}")
"""


def test_agents_writing_at_once_lose_no_line(tmp_path: Path) -> None:
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), f"host-{i}"], env=cli_env()) for i in range(6)
    ]
    assert [writer.wait(120) for writer in writers] == [0] * 6
    lines = node_names.parse((tmp_path / "node-name").read_text())
    assert sorted(lines) == sorted((f"host-{i}", f"gpu{n:02d}") for i in range(6) for n in range(20))


def test_two_agent_names_on_one_host_are_refused_naming_the_way_out(tmp_path: Path) -> None:
    _record(tmp_path, HOST, "node-01")
    _record(tmp_path, HOST, "node-02")
    with pytest.raises(ConfigError) as caught:
        this_node("", {}, tmp_path)
    assert caught.value.field == "--node"
    assert f"2 agent names for host {HOST} (node-01, node-02)" in caught.value.reason
    assert this_node("node-02", {}, tmp_path) == "node-02"
    assert this_node("", {"TOPO_TUNE_NODE_NAME": "node-01"}, tmp_path) == "node-01"


def test_slurms_node_name_comes_before_the_file_and_the_host_name(tmp_path: Path) -> None:
    _record(tmp_path, HOST, "recorded")
    assert this_node("", {"SLURMD_NODENAME": "slurm-7"}, tmp_path) == "slurm-7"
    environ = {"SLURMD_NODENAME": "slurm-7", "TOPO_TUNE_NODE_NAME": "mine"}
    assert this_node("", environ, tmp_path) == "mine"
    assert this_node("", {}, tmp_path) == "recorded"
    assert this_node("", {}, tmp_path / "no-agent") == HOST


def test_a_line_without_a_host_from_an_older_agent_names_no_host(tmp_path: Path) -> None:
    (tmp_path / "node-name").write_text("gpu09\n")
    assert this_node("", {}, tmp_path) == HOST
    _record(tmp_path, "host-a", "gpu01")
    assert (tmp_path / "node-name").read_text() == "host-a gpu01\n"


async def _env(controller: Controller, config_dir: Path, **environ: str) -> tuple[int, str, str]:
    argv = [sys.executable, "-m", "topo_tune", "env", "--job-id", "ident-1", "--nodes", f"other-host,{HOST}"]
    env = cli_env(TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}", **environ)
    process = await asyncio.create_subprocess_exec(
        *argv, "--config-dir", str(config_dir), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_env_on_two_hosts_of_a_shared_directory_gets_two_ranks(controller: Controller, tmp_path: Path) -> None:
    shared = tmp_path / "shared-config"
    shared.mkdir()
    _record(shared, "other-host", "other-host")  # the other host's agent wrote last
    code, out, err = await _env(controller, shared)
    assert code == 0, err
    order = next(line for line in out.splitlines() if "TOPO_TUNE_NODE_ORDER" in line).split("=")[1].split(",")
    assert f"export TOPO_TUNE_NODE_RANK={order.index(HOST)}" in out.splitlines(), "this host's, not the last writer's"
    code, out, err = await _env(controller, shared, SLURMD_NODENAME="other-host")
    assert code == 0 and f"export TOPO_TUNE_NODE_RANK={order.index('other-host')}" in out.splitlines(), err
    _record(shared, HOST, "a")
    _record(shared, HOST, "b")
    code, out, err = await _env(controller, shared)
    assert (code, out) == (1, "")
    assert f"--node: {shared / 'node-name'} records 2 agent names for host {HOST} (a, b)" in err
