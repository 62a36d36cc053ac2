"""Job ids that launchers reuse cannot pick up another job's pin: where the launcher exports a per-run value
(Slurm's job start time, Open MPI's per-launch transport key), it is part of the id the pin is made under;
torchrun's default run id names no job."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import subprocess
import sys

from tests.support.processes import cli_env
from topo_tune.controller.server import Controller
from topo_tune.jobs.config import job_id_from_env, slurm_job_id

KEY = "d29127f7c0771555-cee88a9a814b78e2"
"""What Open MPI 4.1 exports as OMPI_MCA_orte_precondition_transports (recorded from a real mpirun)."""


def _mpirun(namespace: str, key: str) -> dict[str, str]:
    return {
        "PMIX_NAMESPACE": namespace,
        "OMPI_MCA_ess_base_jobid": namespace,
        "OMPI_MCA_orte_precondition_transports": key,
    }


def test_a_reused_pmix_namespace_is_another_job_in_another_launch() -> None:
    first, again = job_id_from_env(_mpirun("2040266753", KEY)), job_id_from_env(_mpirun("2040266753", KEY))
    assert first == again == f"2040266753+{hashlib.sha256(KEY.encode()).hexdigest()[:16]}", "every rank agrees"
    assert KEY not in first, "a transport key is not sent to the controller"
    assert job_id_from_env(_mpirun("2040266753", "0000-1111")) != first
    assert job_id_from_env({"PMIX_NAMESPACE": "2040266753"}) == "2040266753", "nothing to tell runs apart"


def test_slurms_start_time_tells_a_reused_job_id_apart() -> None:
    started = {"SLURM_JOB_ID": "41", "SLURM_JOB_START_TIME": "1764825600"}
    assert job_id_from_env(started) == slurm_job_id({**started, "TOPO_TUNE_JOB_ID": "x"}) == "41+1764825600"
    assert job_id_from_env({"SLURM_JOB_ID": "41"}) == slurm_job_id({"SLURM_JOB_ID": "41"}) == "41"
    assert job_id_from_env({**started, "TOPO_TUNE_JOB_ID": "mine"}) == "mine", "an id given is taken as given"


def test_torchruns_default_run_id_names_no_job() -> None:
    assert job_id_from_env({"TORCHELASTIC_RUN_ID": "none"}) == ""
    assert job_id_from_env({"TORCHELASTIC_RUN_ID": "none", **_mpirun("7", KEY)}).startswith("7+")


async def _env(controller: Controller, nodes: str, environ: dict[str, str]) -> tuple[int, str]:
    argv = [sys.executable, "-m", "topo_tune", "env", "--nodes", nodes, "--node", nodes.split(",", maxsplit=1)[0]]
    env = cli_env(TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}", **environ)
    process = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, (out + err).decode()


async def test_a_new_launch_under_a_reused_namespace_gets_its_own_pin(controller: Controller) -> None:
    code, printed = await _env(controller, "ns-a,ns-b", _mpirun("31337", KEY))
    assert code == 0, printed
    # The namespace comes back in a later mpirun on other nodes: the old pin would refuse them (or, on the same
    # nodes, hand them the old job's version and order); the new launch's own key gives it its own pin.
    code, printed = await _env(controller, "ns-c,ns-d", _mpirun("31337", "another-launch"))
    assert code == 0, printed
    assert "export TOPO_TUNE_NODE_ORDER=ns-c,ns-d" in printed
    code, printed = await _env(controller, "ns-c,ns-d", _mpirun("31337", KEY))
    assert code == 1 and "is pinned to NCCL defaults on 2 nodes" in printed, "the first launch's pin still stands"


def test_without_a_start_time_slurms_node_list_tells_a_reused_id_apart() -> None:
    """Slurm 22.05 exports no start time: one id on other nodes is another job, on the same nodes the same."""
    five = {"SLURM_JOB_ID": "6", "SLURM_JOB_NODELIST": "a,b,c,d,e"}
    four = {"SLURM_JOB_ID": "6", "SLURM_JOB_NODELIST": "b,c,d,e"}
    assert job_id_from_env(five) == slurm_job_id({**five, "TOPO_TUNE_JOB_ID": "x"}) == job_id_from_env(dict(five))
    assert job_id_from_env(five) != job_id_from_env(four)
    assert job_id_from_env(five).startswith("6+n")
    started = {**five, "SLURM_JOB_START_TIME": "1764825600"}
    assert job_id_from_env(started) == "6+1764825600"


_RANK_ID = "import os; from topo_tune.jobs.config import job_id_from_env; print(job_id_from_env(os.environ))"


def _real_mpirun_ids() -> list[str]:
    """The id each rank of one real ``mpirun -np 2`` (Open MPI, this host) makes its pin under."""
    mpirun = shutil.which("mpirun")
    assert mpirun is not None, "Open MPI's mpirun (make test installs openmpi-bin)"
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    for name in ("TOPO_TUNE_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    done = subprocess.run(
        [mpirun, "-np", "2", "--oversubscribe", sys.executable, "-c", _RANK_ID],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Open MPI forwards each rank's output on its own; two ranks' lines can arrive run together ("idid\n").
    return re.findall(r"[0-9]+\+[0-9a-f]{16}", done.stdout)


def test_every_rank_of_a_real_mpirun_shares_an_id_that_no_other_launch_has() -> None:
    """Real Open MPI: the ranks of one launch agree on the id (so they share one pin), and its per-launch part
    comes from the launch's transport key, so a later launch that got the same PMIx namespace (same host,
    a reused pid) would still be another job."""
    first, second = _real_mpirun_ids(), _real_mpirun_ids()
    assert len(first) == len(second) == 2 and len(set(first)) == len(set(second)) == 1, (first, second)
    namespace, instance = first[0].split("+")
    assert namespace.isdigit() and len(instance) == 16, first
    assert second[0].split("+")[1] != instance, "each launch's own transport key"
