"""The launcher examples of ``topo-tune exec --help`` run as written (in bash, with the variables they name),
and each rank's inner ``exec`` gets the job's pin: the same job id, the same order, its own node rank.

The launchers are stand-ins on PATH that start each rank of their hostfile on this machine the way the real
one would hand it its environment: mpirun only what ``-x`` names, srun everything; a rank's host is given as
TOPO_TUNE_NODE_NAME (on a real host its agent's node-name line or SLURMD_NODENAME says it). The real launchers
across hosts are the real-launcher tests'."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import cli_env, run_cli
from topo_tune.controller.server import Controller
from topo_tune.jobs.config import job_id_from_env

pytestmark = pytest.mark.slow  # stand-in launchers starting every rank's exec against a real controller and agent

NODES = "ex-b,ex-a"
LAUNCHER = """#!{python}
import json, os, pathlib, subprocess, sys
argv = sys.argv[1:]
pathlib.Path("launcher.json").write_text(json.dumps(argv))
if pathlib.Path(sys.argv[0]).name == "torchrun":
    sys.exit(0)
forwarded, at, hosts = {{}}, 0, []
if pathlib.Path(sys.argv[0]).name == "mpirun":
    while argv[at].startswith("-"):
        if argv[at] == "--mca":
            at += 3
            continue
        if argv[at] == "-x":
            forwarded[argv[at + 1]] = os.environ[argv[at + 1]]
        if argv[at] == "--hostfile":
            hosts = pathlib.Path(argv[at + 1]).read_text().split()
        at += 2
    base = {{name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}}
else:
    while argv[at].startswith("-"):
        at += 1
    hosts = pathlib.Path(os.environ["SLURM_HOSTFILE"]).read_text().split()
    base = dict(os.environ)
for rank in (0, len(hosts) - 1):
    env = {{**base, **forwarded, "TOPO_TUNE_NODE_NAME": hosts[rank], "RANK_INDEX": str(rank)}}
    subprocess.run(argv[at:], env=env, check=True)
"""
TRAIN = """import json, os
keys = ("RANK_INDEX", "TOPO_TUNE_JOB_ID", "TOPO_TUNE_NODE_RANK", "TOPO_TUNE_NODE_ORDER", "NCCL_CONF_FILE")
with open("ranks.jsonl", "a") as out:
    out.write(json.dumps({key: os.environ.get(key) for key in keys}) + "\\n")
"""


def _examples() -> dict[str, str]:
    """The help's launcher examples by launcher, continuation lines joined."""
    text = run_cli("exec", "--help", env=cli_env(COLUMNS="200")).stdout
    found = re.findall(r"^ *(torchrun|Slurm|Open MPI): +(topo-tune exec (?:.*\\\n)*.*)$", text, re.MULTILINE)
    return {name: re.sub(r"\\\n\s*", "", example) for name, example in found}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("mpirun", "srun", "torchrun"):
        (bin_dir / name).write_text(LAUNCHER.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    (bin_dir / "topo-tune").write_text(f'#!/bin/sh\nexec {sys.executable} -m topo_tune "$@"\n')
    (bin_dir / "topo-tune").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def _run(example: str, controller: Controller, workdir: Path, **extra: str) -> None:
    env = cli_env(
        TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}",
        TOPO_TUNE_CONFIG_DIR=str(workdir / "config"),
        PATH=f"{workdir / 'bin'}{os.pathsep}{os.environ['PATH']}",
        RUN="run-7",
        **{"NODES": NODES, **extra},
    )
    result = subprocess.run(
        ["bash", "-c", example], check=False, env=env, cwd=workdir, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr


def _ranks(workdir: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (workdir / "ranks.jsonl").read_text().splitlines()]


def test_the_help_has_the_three_launcher_examples() -> None:
    assert sorted(_examples()) == ["Open MPI", "Slurm", "torchrun"]


@pytest.mark.parametrize("launcher", ["Open MPI", "Slurm"])
async def test_the_mpi_and_slurm_examples_give_every_rank_the_jobs_pin(
    controller: Controller, workdir: Path, launcher: str
) -> None:
    example = _examples()[launcher]  # the controller answers on this test's event loop: run the example beside it
    await asyncio.to_thread(
        _run, example, controller, workdir, SLURM_JOB_ID="run-7", SLURM_JOB_NODELIST=NODES, SLURM_NNODES="2"
    )
    ranks = _ranks(workdir)
    order = ranks[0]["TOPO_TUNE_NODE_ORDER"].split(",")
    assert sorted(order) == sorted(NODES.split(","))
    # Open MPI's example names the job (--job-id "$RUN"); Slurm's takes Slurm's id with its allocation's digest.
    job = "run-7" if launcher == "Open MPI" else job_id_from_env({"SLURM_JOB_ID": "run-7", "SLURM_JOB_NODELIST": NODES})
    assert [r["TOPO_TUNE_JOB_ID"] for r in ranks] == [job, job] and job.startswith("run-7")
    assert [r["RANK_INDEX"] for r in ranks] == ["0", "15"], "8 slots on each of 2 nodes"
    assert [r["TOPO_TUNE_NODE_RANK"] for r in ranks] == ["0", "1"], "each rank's own node, in the job's order"
    assert {r["TOPO_TUNE_NODE_ORDER"] for r in ranks} == {",".join(order)}


async def test_the_torchrun_example_gets_this_nodes_rank(controller: Controller, workdir: Path) -> None:
    host = "ex-host"
    example = _examples()["torchrun"]
    await asyncio.to_thread(_run, example, controller, workdir, NODES=f"ex-b,{host}", TOPO_TUNE_NODE_NAME=host)
    argv = json.loads((workdir / "launcher.json").read_text())
    assert argv[0] == "--node_rank=" + str(sorted(["ex-b", host]).index(host)) and argv[-1] == "train.py"
    assert argv[1:3] == ["--nnodes=2", f"--master_addr={sorted(['ex-b', host])[0]}"]
