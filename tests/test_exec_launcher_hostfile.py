"""``exec --launcher mpi|slurm`` runs the launcher as its child: the launcher reads the job's hostfile, gets the
signals a scheduler sends to ``exec``, and ``exec`` ends as it ended, with the hostfile's directory removed.

The launchers here are stand-ins on PATH (no MPI or Slurm in CI) that record what they were given."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from tests.support.processes import cli_env
from topo_tune.controller.server import Controller

LAUNCHER = """#!{python}
import json, os, pathlib, signal, sys, time
argv = sys.argv[1:]
flag = "--hostfile" if "--hostfile" in argv else None
hostfile = argv[argv.index(flag) + 1] if flag else os.environ["SLURM_HOSTFILE"]
record = pathlib.Path(os.environ["RECORD"])
def on_term(number, frame):
    record.with_suffix(".signal").write_text(signal.Signals(number).name)
    os.kill(os.getpid(), signal.SIGKILL)
signal.signal(signal.SIGTERM, on_term)
record.write_text(json.dumps({{"argv": argv, "hostfile": hostfile, "lines": pathlib.Path(hostfile).read_text(),
                              "order": os.environ["TOPO_TUNE_NODE_ORDER"]}}))
if os.environ.get("LAUNCHER_WAITS"):
    time.sleep(60)
sys.exit(3)
"""


def _launchers(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("mpirun", "srun"):
        path = bin_dir / name
        path.write_text(LAUNCHER.format(python=sys.executable))
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RECORD": str(tmp_path / "record.json")}


async def _exec(controller: Controller, tmp_path: Path, *args: str, **env: str) -> asyncio.subprocess.Process:
    argv = [sys.executable, "-m", "topo_tune", "exec", "--job-id", "hf-1", "--nodes", "gpu03,gpu01"]
    argv += ["--config-dir", str(tmp_path / "config"), *args]
    environ = cli_env(TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}", **_launchers(tmp_path), **env)
    return await asyncio.create_subprocess_exec(*argv, env=environ, stderr=asyncio.subprocess.PIPE)


async def test_mpirun_reads_the_jobs_hostfile_and_exec_ends_with_its_status_and_removes_it(
    controller: Controller, tmp_path: Path
) -> None:
    process = await _exec(controller, tmp_path, "--launcher", "mpi", "--slots", "2", "--", "mpirun", "train")
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 3, err.decode()
    got = json.loads((tmp_path / "record.json").read_text())
    order = got["order"].split(",")
    assert sorted(order) == ["gpu01", "gpu03"]
    assert got["lines"] == "".join(f"{host}\n{host}\n" for host in order), "one line per rank, in the job's order"
    assert got["argv"] == ["--mca", "rmaps", "seq", "--hostfile", got["hostfile"], "-np", "4", "train"]
    assert not Path(got["hostfile"]).parent.exists(), "its private directory goes with the launcher"


async def test_a_sigterm_to_exec_reaches_srun_and_exec_dies_of_what_srun_died_of(
    controller: Controller, tmp_path: Path
) -> None:
    process = await _exec(controller, tmp_path, "--launcher", "slurm", "--", "srun", "train", LAUNCHER_WAITS="1")
    record = tmp_path / "record.json"
    started = asyncio.create_task(process.wait())
    for _ in range(600):
        if record.exists() or started.done():
            break
        await asyncio.sleep(0.1)
    assert record.exists(), (await process.communicate())[1].decode()
    process.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert (tmp_path / "record.signal").read_text() == "SIGTERM", "exec passed the scheduler's signal on"
    assert process.returncode == -signal.SIGKILL, err.decode()
    assert not Path(json.loads(record.read_text())["hostfile"]).parent.exists()
