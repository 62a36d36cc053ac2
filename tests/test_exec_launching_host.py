"""Where ``exec`` checks that the job's version is staged: on the node a rank runs on (``env``, plain ``exec``,
``exec --launcher torchrun``), not on the host that only starts srun or mpirun (``salloc`` on a login node,
mpirun from a host without an agent), where a staged copy must still be unchanged.

A real controller and sim agent with a version rolled out; the launchers are stand-ins on PATH that record
their environment (the real ones across hosts are the real-launcher tests')."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import controller_settings
from tests.controller.rollout.fleet import V1, SimVerifier
from tests.support.processes import cli_env
from tests.support.rolled_out import roll_out
from tests.support.sim_agent import sim_agent
from topo_tune.agent.config_store import ConfigStore
from topo_tune.controller.server import Controller

pytestmark = pytest.mark.slow  # a real controller and sim agent, launchers starting ranks

NODE = "launch-n1"
RECORDER = """#!{python}
import json, os, pathlib, sys
pathlib.Path(os.environ["RECORD"]).write_text(json.dumps({{"argv": sys.argv, "conf": os.environ["NCCL_CONF_FILE"]}}))
"""


@pytest.fixture
async def rolled_out(sqlite_url: str, tmp_path: Path) -> AsyncIterator[str]:
    """A controller whose stable version is V1, staged on its one node's agent; yields its address."""
    server = Controller(controller_settings(sqlite_url, heartbeat_expiry_s=10.0))
    await server.start()
    address = f"127.0.0.1:{server.port}"
    try:
        async with sim_agent(server.port, tmp_path / "agent", node=NODE, config_dir=tmp_path / "node-config"):
            server.rollouts.verifier = SimVerifier({NODE: "rack-1"})
            await roll_out(address, V1)
            yield address
    finally:
        await server.stop()


async def _exec(address: str, tmp_path: Path, config_dir: Path, *args: str) -> tuple[int, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("srun", "mpirun"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    argv = [sys.executable, "-m", "topo_tune", "exec", "--job-id", "login-1", "--nodes", NODE, "--node", NODE]
    environ = cli_env(
        TOPO_TUNE_CONTROLLER=address,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        RECORD=str(tmp_path / "record.json"),
    )
    process = await asyncio.create_subprocess_exec(
        *argv, "--config-dir", str(config_dir), *args, env=environ, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, err.decode()


@pytest.mark.parametrize(("launcher", "command"), [("slurm", "srun"), ("mpi", "mpirun")])
async def test_a_launching_host_without_the_version_starts_the_launcher(
    rolled_out: str, tmp_path: Path, launcher: str, command: str
) -> None:
    login = tmp_path / "login-node-config"  # no agent here: nothing staged, no jobs.lock
    code, err = await _exec(rolled_out, tmp_path, login, "--launcher", launcher, "--", command, "train")
    assert code == 0, err
    got = json.loads((tmp_path / "record.json").read_text())
    assert Path(got["argv"][0]).name == command and got["argv"][-1] == "train"
    assert got["conf"].endswith(f"/versions/{V1.id}/nccl.conf"), "the ranks' inner exec checks their own nodes"


async def test_a_rank_on_a_node_without_the_version_is_still_refused(rolled_out: str, tmp_path: Path) -> None:
    code, err = await _exec(rolled_out, tmp_path, tmp_path / "empty", "--", sys.executable, "-c", "pass")
    assert code == 1
    assert f"{V1.id} is not staged on this node" in err


async def test_a_changed_copy_on_the_launching_host_is_refused(rolled_out: str, tmp_path: Path) -> None:
    here = tmp_path / "launching-host-config"  # no agent re-applies it here
    here.mkdir()
    ConfigStore(here).apply(V1.id, V1.files)
    conf = here / "versions" / V1.id / "nccl.conf"
    conf.chmod(0o644)
    conf.write_text("NCCL_MIN_CTAS=1\n")
    code, err = await _exec(rolled_out, tmp_path, here, "--launcher", "slurm", "--", "srun", "t")
    assert code == 1 and not (tmp_path / "record.json").exists()
    assert "it was changed after staging; not handing it to a job" in err
