"""``topo-tune slurm task-prolog``: a real controller and sim agent, and a real slurmctld + slurmd running it as
``TaskProlog=`` for a job script with no topo-tune in it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import controller_settings
from tests.controller.rollout.fleet import V1, SimVerifier
from tests.support.processes import TOKEN, free_port
from tests.support.rolled_out import roll_out
from tests.support.sim_agent import sim_agent
from tests.support.slurm_one_node import slurm_missing, slurm_one_node
from tests.support.waiting import wait_until
from topo_tune.cli.main import cli
from topo_tune.controller.server import Controller
from topo_tune.jobs.config import slurm_job_id
from topo_tune.jobs.task_prolog import prolog_lines

# Every real Slurm of the suite runs in one xdist group: one at a time, never two munge/slurmctld sets at once.
pytestmark = pytest.mark.xdist_group("real-slurm")

NODE = "tt-node1"


@pytest.fixture
async def controller(sqlite_url: str) -> AsyncIterator[Controller]:
    """The suite's controller with a 10 s heartbeat expiry: a machine busy with other tests can hold the agent's
    heartbeats past the usual 1 s, and a lost node would pause the rollout these tests stage (losing nodes is
    not what they test)."""
    server = Controller(controller_settings(sqlite_url, heartbeat_expiry_s=10.0))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@dataclass
class Staged:
    address: str
    config_dir: Path
    conf: Path
    """The staged nccl.conf of V1, the version every job gets."""


@pytest.fixture
async def staged(controller: Controller, tmp_path: Path) -> AsyncIterator[Staged]:
    """One sim agent named as the Slurm node, with V1 rolled out to it (the stable version)."""
    address = f"127.0.0.1:{controller.port}"
    config_dir = tmp_path / "agent-config"
    async with sim_agent(controller.port, tmp_path / "agent", node=NODE, config_dir=config_dir):
        controller.rollouts.verifier = SimVerifier({NODE: "rack-1"})
        await roll_out(address, V1)
        yield Staged(address, config_dir, config_dir / "versions" / V1.id / "nccl.conf")


def _prolog(staged: Staged, tmp_path: Path, *, address: str = "", job: str = "41") -> tuple[int, str, str]:
    environ = {
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NODELIST": NODE,
        "SLURMD_NODENAME": NODE,
        "TOPO_TUNE_TOKEN": TOKEN,
    }
    args = ["slurm", "task-prolog", "--controller", address or staged.address, "--config-dir", str(staged.config_dir)]
    args += ["--cache-dir", str(tmp_path / "cache"), "--log-file", str(tmp_path / "prolog.log"), "--timeout", "2"]
    result = CliRunner().invoke(cli, args, env=environ)
    log = (tmp_path / "prolog.log").read_text() if (tmp_path / "prolog.log").exists() else ""
    return result.exit_code, result.stdout, log


async def test_the_prolog_exports_the_pinned_version_and_order_once_per_job_and_node(
    staged: Staged, tmp_path: Path
) -> None:
    code, printed, log = await asyncio.to_thread(_prolog, staged, tmp_path)
    assert (code, log) == (0, ""), log
    assert printed.splitlines() == [
        f"export TOPO_TUNE_CONFIG_VERSION={V1.id}",
        f"export TOPO_TUNE_JOB_ID={slurm_job_id({'SLURM_JOB_ID': '41', 'SLURM_JOB_NODELIST': NODE})}",
        f"export NCCL_CONF_FILE={staged.conf}",
        f"export TOPO_TUNE_NODE_ORDER={NODE}",
        "export TOPO_TUNE_NNODES=1",
        "export TOPO_TUNE_MASTER_ADDR=127.0.0.1",
        "export TOPO_TUNE_NODE_RANK=0",
    ]
    # The node's next task reads the node's cached answer: no controller needed for it.
    again = await asyncio.to_thread(_prolog, staged, tmp_path, address=f"127.0.0.1:{free_port()}")
    assert again == (0, printed, "")
    # A day-old answer of another job is removed when a new one is written; this job's stays.
    stale = tmp_path / "cache" / "0123456789abcdef0123456789abcdef.json"
    stale.write_text('{"lines": ["export TOPO_TUNE_NNODES=9"], "reason": ""}')
    os.utime(stale, (time.time() - 2 * 24 * 3600,) * 2)
    # Another job with the controller unreachable: nothing printed, exit 0, the log says why.
    unreachable = f"127.0.0.1:{free_port()}"
    code, printed, log = await asyncio.to_thread(_prolog, staged, tmp_path, address=unreachable, job="42")
    assert (code, printed) == (0, "")
    job = slurm_job_id({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": NODE})
    assert f"job {job} on tt-node1:" in log and "the job runs on NCCL's defaults" in log
    assert not stale.exists()
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2, "job 41's answer and job 42's reason"


def test_outside_slurm_it_prints_nothing_and_says_why(tmp_path: Path) -> None:
    args = ["slurm", "task-prolog", "--cache-dir", str(tmp_path / "c"), "--log-file", str(tmp_path / "log")]
    result = CliRunner().invoke(cli, args, env={"SLURM_JOB_ID": "", "SLURMD_NODENAME": "n1"})
    assert (result.exit_code, result.stdout) == (0, "")
    assert "SLURM_JOB_ID, SLURM_JOB_NODELIST not set: not a Slurm task" in (tmp_path / "log").read_text()


def test_a_shared_cache_directory_is_refused_and_the_answer_still_comes(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    args = ["slurm", "task-prolog", "--cache-dir", str(shared), "--log-file", str(tmp_path / "log")]
    args += ["--controller", f"127.0.0.1:{free_port()}", "--timeout", "1"]
    environ = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURMD_NODENAME": "n1", "TOPO_TUNE_TOKEN": TOKEN}
    result = CliRunner().invoke(cli, args, env=environ)
    assert (result.exit_code, result.stdout) == (0, "")
    assert (
        f"cache not used: {shared} is not a directory of uid {os.getuid()} closed to others"
        in (tmp_path / "log").read_text()
    )
    assert list(shared.iterdir()) == [], "nothing written where another user could have put it"


@pytest.mark.parametrize(
    ("variables", "refused"),
    [
        ({"LD_PRELOAD": "/x.so"}, "LD_PRELOAD is not a variable a task prolog may set"),
        ({"NCCL_CONF_FILE": "/a b"}, "NCCL_CONF_FILE: '/a b' holds characters"),
        ({"TOPO_TUNE_NODE_ORDER": "a\nexport LD_PRELOAD=/x"}, "TOPO_TUNE_NODE_ORDER:"),
        ({"TOPO_TUNE_MASTER_ADDR": "'quoted'"}, "TOPO_TUNE_MASTER_ADDR:"),
    ],
)
def test_only_allow_listed_names_with_values_slurm_reads_as_a_shell_would(
    variables: dict[str, str], refused: str
) -> None:
    with pytest.raises(ValueError, match=refused):
        prolog_lines({"TOPO_TUNE_NNODES": "2", **variables})


async def test_a_job_script_without_topo_tune_gets_the_settings_through_a_real_slurm_task_prolog(
    staged: Staged, tmp_path: Path
) -> None:
    missing = slurm_missing()
    assert not missing, f"{', '.join(missing)} not installed: `make slurm` installs Slurm and munge"
    token = tmp_path / "token"
    token.write_text(TOKEN)
    wrapper = tmp_path / "task-prolog"
    # As docs/slurm.md writes it, except that the controller comes from the job's environment (so the second job
    # can point at a port where none listens).
    wrapper.write_text(
        f"#!/bin/sh\n{sys.executable} -m topo_tune slurm task-prolog --token-file {token} "
        f"--config-dir {staged.config_dir} --cache-dir {tmp_path / 'cache'} --log-file {tmp_path / 'prolog.log'}"
        " || true\n"
    )
    wrapper.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/sh\nsrun --ntasks=1 env > "$1.step"\nenv > "$1.partial" && mv "$1.partial" "$1"\n')
    tuned, untuned = tmp_path / "tuned.env", tmp_path / "untuned.env"
    jobs = [(tuned, staged.address), (untuned, f"127.0.0.1:{free_port()}")]
    await asyncio.to_thread(_run_jobs, tmp_path / "slurm", script, [f"TaskProlog={wrapper}"], jobs)
    batch = _environment(tuned)
    step = _environment(Path(f"{tuned}.step"))
    for task in (batch, step):
        assert task["NCCL_CONF_FILE"] == str(staged.conf), "unquoted: slurmstepd passes quotes on"
        assert task["TOPO_TUNE_CONFIG_VERSION"] == V1.id
        order = (task["TOPO_TUNE_NODE_RANK"], task["TOPO_TUNE_NNODES"], task["TOPO_TUNE_NODE_ORDER"])
        assert order == ("0", "1", NODE)
    assert batch["TOPO_TUNE_JOB_ID"] == slurm_job_id(batch), "the id the job's own exec asks with"
    assert "NCCL_CONF_FILE" not in _environment(untuned), "no controller: NCCL's defaults, and the job ran"
    assert "the job runs on NCCL's defaults" in (tmp_path / "prolog.log").read_text()


def _run_jobs(root: Path, script: Path, conf_lines: list[str], jobs: list[tuple[Path, str]]) -> None:
    """Submit ``script OUT`` once per (OUT, controller) and wait for each job's OUT."""
    with slurm_one_node(root, node=NODE, conf_lines=conf_lines) as slurm:
        for out, controller in jobs:
            submitted = subprocess.run(
                ["sbatch", "--output", f"{out}.log", str(script), str(out)],
                env=slurm.env(TOPO_TUNE_CONTROLLER=controller),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert submitted.returncode == 0, submitted.stderr
            wait_until(out.exists, timeout=90, interval=0.2, what=f"{out.name} ({slurm.logs()})")


def _environment(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
