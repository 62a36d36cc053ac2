"""The job's node order over real gRPC: computed from the version's pair matrix, pinned with the job id per
arm, the same for node lists in any order, readable with the job credential, node rank 0's registered
address; ``hostfile`` prints it with both predicted bottlenecks and pins nothing."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.processes import TOKEN, cli_env, free_port
from tests.support.sim_agent import sim_agent
from tests.tuner.test_job_order import SIX_MAP
from topo_tune.agent.daemon import Agent
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.client.credential_entries import IssuedRole
from topo_tune.controller.server import Controller
from topo_tune.errors import ConflictError, PermissionDenied, ValidationError
from topo_tune.versions.version import ConfigVersion

VERSION = ConfigVersion({"nccl.conf": "NCCL_MIN_NCHANNELS=4\n", "rankmap.json": SIX_MAP})


@pytest.fixture
async def agent_p(controller: Controller, tmp_path: Path) -> AsyncIterator[Agent]:
    """Node p's agent, advertising 127.0.0.7: p is node rank 0 of the test's job."""
    async with sim_agent(controller.port, tmp_path / "p", node="p", address="127.0.0.7") as agent:
        yield agent


async def test_the_order_is_pinned_per_arm_and_the_same_for_any_listing(controller: Controller, agent_p: Agent) -> None:
    address = f"127.0.0.1:{controller.port}"
    with AdminClient(address, token=TOKEN) as admin:
        stored = await asyncio.to_thread(admin.put_config_version, dict(VERSION.files), {"study": "t"})
        token = (await asyncio.to_thread(admin.issue_credential, IssuedRole.JOB)).token
    with AdminClient(address, token=token) as job:
        first = await asyncio.to_thread(job.resolve_job_config, "job-1", ["u", "s", "r", "p"], arm=stored.id)
        again = await asyncio.to_thread(job.resolve_job_config, "job-1", ["p", "r", "s", "u"], arm=stored.id)
        own = await asyncio.to_thread(job.resolve_job_config, "job-1", ["s", "p", "u", "r"])
        with pytest.raises(ConflictError, match="no place in its node order"):
            await asyncio.to_thread(job.resolve_job_config, "job-1", ["p", "q"], arm=stored.id)
        with pytest.raises(PermissionDenied):
            await asyncio.to_thread(job.get_config_version, stored.id)
    assert list(first.node_order) == ["p", "s", "r", "u"] and first.order_method == "replanned"
    assert (first.order_bottleneck_gbps, first.given_bottleneck_gbps) == (100.0, 10.0)
    assert first.master_addr == "127.0.0.7", "the address node rank 0's agent registered"
    assert again == first, "the second node, listing the nodes otherwise, gets the same answer"
    assert (own.config_version, own.arm, list(own.node_order)) == ("", "", ["p", "r", "s", "u"]), "defaults"
    pin = await controller.rollout_store.get_pin("job-1", arm=stored.id)
    assert pin is not None and pin.order == ("p", "s", "r", "u") and pin.version == stored.id


async def test_hostfile_prints_the_order_with_both_predictions_and_pins_nothing(
    controller: Controller, agent_p: Agent
) -> None:
    address = f"127.0.0.1:{controller.port}"
    with AdminClient(address, token=TOKEN) as admin:
        stored = await asyncio.to_thread(admin.put_config_version, dict(VERSION.files), {"study": "t"})
    args = ["hostfile", "--controller", address, "--nodes", "u,s,r,p", "--version", stored.id, "--slots", "8"]
    shown = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines() == [
        f"# topo-tune job order for 4 node(s), {stored.id}: re-planned over the job's nodes",
        "# predicted ring bottleneck 100.00 GB/s vs 10.00 GB/s in the launcher's order (nodes sorted by name): "
        "10.00x (0 of 4 ring edges measured)",
        "# mpirun --mca rmaps seq --hostfile THIS_FILE -np 32: one line per rank, in rank order",
        *[node for node in "psru" for _ in range(8)],
    ]
    bad = await asyncio.to_thread(
        CliRunner().invoke, cli, [*args[:5], "--version", "newest"], env={"TOPO_TUNE_TOKEN": TOKEN}
    )
    assert bad.exit_code == 2 and "--version: 'newest' is not a config version id" in bad.output
    assert await controller.rollout_store.get_pin("preview", arm=stored.id) is None, "a preview pins nothing"


async def test_the_order_as_json_names_each_prediction_and_null_where_the_version_cannot_tell(
    controller: Controller, agent_p: Agent, tmp_path: Path
) -> None:
    """What a script reads from ``hostfile -o json`` and ``env -o json``, key by key in the order printed."""
    address = f"127.0.0.1:{controller.port}"
    with AdminClient(address, token=TOKEN) as admin:
        stored = await asyncio.to_thread(admin.put_config_version, dict(VERSION.files), {"study": "t"})
    args = ["hostfile", "--controller", address, "--nodes", "u,s,r,p", "--version", stored.id, "-o", "json"]
    shown = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    assert shown.exit_code == 0, shown.output
    order = {
        "node_order": ["p", "s", "r", "u"],
        "method": "replanned",
        "predicted_bottleneck_gbps": 100.0,
        "launcher_order_bottleneck_gbps": 10.0,
        "measured_edges": 0,
        "ring_edges": 4,
        "master_addr": "127.0.0.7",
        "warnings": [],
    }
    assert shown.stdout == json.dumps({"config_version": stored.id, "order": order}, indent=2) + "\n"

    # The job's own config with no rollout is NCCL's defaults: no pair matrix, so no prediction either way.
    args = ["env", "--controller", address, "--job-id", "json-1", "--nodes", "s,p", "--node", "s", "-o", "json"]
    env = {"TOPO_TUNE_TOKEN": TOKEN, "TOPO_TUNE_CONFIG_DIR": str(tmp_path / "s")}
    shown = await asyncio.to_thread(CliRunner().invoke, cli, args, env=env)
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert list(data) == ["job_id", "config_version", "env", "order"] and data["config_version"] == ""
    assert data["env"]["TOPO_TUNE_NODE_RANK"] == str(data["order"]["node_order"].index("s"))
    assert data["job_id"] == data["env"]["TOPO_TUNE_JOB_ID"] == "json-1"
    assert list(data["order"]) == list(order)
    assert (data["order"]["predicted_bottleneck_gbps"], data["order"]["launcher_order_bottleneck_gbps"]) == (None, None)


@pytest.mark.parametrize("job_id", ["a/b", "../x", "job 1", "j\nINFO forged", "-lead", "x" * 254])
async def test_a_job_id_that_is_not_an_id_is_refused_naming_the_flag_and_nothing_is_pinned(
    controller: Controller, job_id: str
) -> None:
    address = f"127.0.0.1:{controller.port}"
    args = ["hostfile", "--controller", address, "--nodes", "u,s", "--job-id", job_id]
    shown = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    assert shown.exit_code != 0 and "--job-id" in shown.output and "not a valid job id" in shown.output, shown.output
    with AdminClient(address, token=TOKEN) as admin, pytest.raises(ValidationError, match="job_id"):
        await asyncio.to_thread(admin.resolve_job_config, job_id, ["u", "s"])
    assert await controller.rollout_store.get_pin(job_id) is None


@pytest.mark.parametrize(
    "job_id", ["1234567", "prterun-host-12345@1", "3f2a9c1e-0d4b-4c6a-9e8f-7a6b5c4d3e2f", "a.b_c:d+e=f"]
)
async def test_job_ids_that_launchers_give_are_accepted(controller: Controller, job_id: str) -> None:
    with AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as admin:
        config = await asyncio.to_thread(admin.resolve_job_config, job_id, ["u", "s"])
    assert config.job_id == job_id


RANK_SCRIPT = """
import os, pathlib, torch.distributed as dist
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
line = (f"node {os.environ['TOPO_TUNE_NODE_RANK']} group {os.environ['GROUP_RANK']} rank {dist.get_rank()}"
        f" of {dist.get_world_size()} order {os.environ['TOPO_TUNE_NODE_ORDER']}")
# one file per rank: the ranks of a node share one stdout, and their writes would interleave there
(pathlib.Path(os.environ["RANKS_DIR"]) / f"rank-{dist.get_rank()}").write_text(line)
dist.destroy_process_group()
"""


@pytest.mark.slow
async def test_exec_launcher_torchrun_gives_each_node_its_rank_in_the_jobs_order(
    controller: Controller, tmp_path: Path
) -> None:
    """Two real torchruns (static rendezvous, gloo), started by exec on 'two nodes' that list the nodes
    differently: torchrun's node ranks are the job's order, and they meet in one job of 2 x 2 ranks."""
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    port = str(free_port())
    async with sim_agent(controller.port, tmp_path / "p", node="p", address="127.0.0.1"):
        processes = []
        for node, listed in (("s", "s,p"), ("p", "p,s")):
            env = cli_env(
                TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}", TOPO_TUNE_NODE_NAME=node, RANKS_DIR=str(ranks)
            )
            torchrun = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node=2", f"--master_port={port}"]
            argv = [sys.executable, "-m", "topo_tune", "exec", "--launcher", "torchrun", "--job-id", "tr-1"]
            argv += ["--nodes", listed, "--config-dir", str(tmp_path / node), "--", *torchrun, str(script)]
            processes.append(
                await asyncio.create_subprocess_exec(
                    *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
                )
            )
        outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in processes)), 180)
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err.decode()[-3000:]
    lines = sorted(path.read_text() for path in ranks.iterdir())
    assert lines == [
        "node 0 group 0 rank 0 of 4 order p,s",
        "node 0 group 0 rank 1 of 4 order p,s",
        "node 1 group 1 rank 2 of 4 order p,s",
        "node 1 group 1 rank 3 of 4 order p,s",
    ]
