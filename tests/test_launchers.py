"""The order handed to each launcher: the variables `env`/`exec` export, torchrun's flags, srun's arbitrary
distribution with SLURM_HOSTFILE, mpirun's hostfile; conflicting flags are refused by name."""

from __future__ import annotations

import pytest

from topo_tune.errors import ConfigError
from topo_tune.jobs.config import order_environment
from topo_tune.jobs.launchers import launch

ORDER = ["gpu03", "gpu01", "gpu04", "gpu02"]


def test_the_order_variables_name_this_nodes_rank() -> None:
    env = order_environment(ORDER, node="gpu04", master_addr="10.0.0.3")
    assert env == {
        "TOPO_TUNE_NODE_ORDER": "gpu03,gpu01,gpu04,gpu02",
        "TOPO_TUNE_NNODES": "4",
        "TOPO_TUNE_MASTER_ADDR": "10.0.0.3",
        "TOPO_TUNE_NODE_RANK": "2",
    }
    assert "TOPO_TUNE_NODE_RANK" not in order_environment(ORDER, node=None, master_addr="x"), "srun/mpirun"


def test_a_node_outside_the_job_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"--node: 'login1' is not one of the job's 4 nodes \(gpu03, gpu01"):
        order_environment(ORDER, node="login1", master_addr="x")


@pytest.mark.parametrize(
    ("command", "at"),
    [
        (["torchrun", "--nproc_per_node=8", "train.py", "--lr", "3"], 1),
        (["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc_per_node=8", "train.py"], 3),
    ],
)
def test_torchrun_gets_node_rank_nnodes_and_master_addr(command: list[str], at: int) -> None:
    got = launch("torchrun", command, order=ORDER, node_rank=2, master_addr="10.0.0.3")
    flags = ["--node_rank=2", "--nnodes=4", "--master_addr=10.0.0.3"]
    assert list(got.argv) == command[:at] + flags + command[at:]
    assert got.hostfile is None and not got.env


def test_torchrun_flags_of_the_training_script_are_the_scripts() -> None:
    command = ["torchrun", "--nproc_per_node=8", "train.py", "--nnodes", "3"]
    assert launch("torchrun", command, order=ORDER, node_rank=0, master_addr="a").argv[-2:] == ("--nnodes", "3")


@pytest.mark.parametrize(
    ("command", "field"),
    [
        (["torchrun", "--node_rank=1", "train.py"], "--node_rank"),
        (["torchrun", "--nnodes", "4", "train.py"], "--nnodes"),
        (["torchrun", "--master-addr=h", "train.py"], "--master-addr"),
        (["torchrun", "--standalone", "train.py"], "--standalone"),
        (["torchrun", "--rdzv-backend=c10d", "train.py"], "--rdzv-backend"),
        (["python", "train.py"], "--launcher"),
    ],
)
def test_torchrun_refuses_what_would_override_the_order(command: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        launch("torchrun", command, order=ORDER, node_rank=0, master_addr="a")
    assert caught.value.field == field


def test_torchrun_needs_this_nodes_rank() -> None:
    with pytest.raises(ConfigError, match="--node"):
        launch("torchrun", ["torchrun", "t.py"], order=ORDER, node_rank=None, master_addr="a")


def test_srun_gets_an_arbitrary_distribution_over_a_hostfile_in_rank_order() -> None:
    command = ["srun", "--ntasks-per-node=2", "python", "-m", "train"]
    got = launch("slurm", command, order=ORDER, node_rank=None, master_addr="a", slots=2, hostfile_path="/t/h")
    assert list(got.argv) == ["srun", "--distribution=arbitrary", *command[1:]], "python's -m is python's"
    assert dict(got.env) == {"SLURM_HOSTFILE": "/t/h"}
    assert got.hostfile == "gpu03\ngpu03\ngpu01\ngpu01\ngpu04\ngpu04\ngpu02\ngpu02\n", "one line per task"
    with pytest.raises(ConfigError, match="--distribution"):
        launch("slurm", ["srun", "--distribution=block", "a.out"], order=ORDER, node_rank=None, master_addr="a")
    with pytest.raises(ConfigError, match="srun"):
        launch("slurm", ["mpirun", "a.out"], order=ORDER, node_rank=None, master_addr="a")


def test_mpirun_gets_a_hostfile_in_the_jobs_order() -> None:
    command = ["mpirun", "-np", "32", "python", "train.py"]
    got = launch("mpi", command, order=ORDER, node_rank=None, master_addr="a", slots=8, hostfile_path="/t/h")
    assert list(got.argv) == ["mpirun", "--hostfile", "/t/h", "-np", "32", "python", "train.py"]
    assert got.hostfile == "gpu03 slots=8\ngpu01 slots=8\ngpu04 slots=8\ngpu02 slots=8\n"
    with pytest.raises(ConfigError, match="-H"):
        launch("mpi", ["mpiexec", "-H", "a,b", "a.out"], order=ORDER, node_rank=None, master_addr="a")
    with pytest.raises(ConfigError, match="--slots"):
        launch("mpi", command, order=ORDER, node_rank=None, master_addr="a", slots=0)
