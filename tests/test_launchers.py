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


def test_mpirun_gets_one_hostfile_line_per_rank_and_the_sequential_mapper() -> None:
    command = ["mpirun", "-x", "NCCL_DEBUG", "python", "train.py"]
    got = launch("mpi", command, order=ORDER, node_rank=None, master_addr="a", slots=2, hostfile_path="/t/h")
    seq = ["--mca", "rmaps", "seq", "--hostfile", "/t/h"]
    assert list(got.argv) == ["mpirun", *seq, "-np", "8", "-x", "NCCL_DEBUG", "python", "train.py"]
    assert got.hostfile == "gpu03\ngpu03\ngpu01\ngpu01\ngpu04\ngpu04\ngpu02\ngpu02\n", "line i is rank i"
    given = ["mpiexec", "-np", "8", "a.out"]
    assert list(launch("mpi", given, order=ORDER, node_rank=None, master_addr="a", slots=2).argv)[-3:] == given[1:]


@pytest.mark.parametrize(
    ("command", "field"),
    [
        (["mpiexec", "-H", "a,b", "a.out"], "-H"),
        (["mpirun", "--mca", "btl", "tcp,self", "-H", "a,b", "a.out"], "-H"),
        (["mpirun", "-x", "NCCL_DEBUG", "--hostfile", "f", "a.out"], "--hostfile"),
        (["mpirun", "--map-by", "node", "a.out"], "--map-by"),
        (["mpirun", "-npernode", "2", "a.out"], "-npernode"),
        (["mpirun", "--mca", "rmaps", "round_robin", "a.out"], "--mca rmaps"),
        (["mpirun", "-np", "32", "a.out"], "-np"),
        (["mpirun", "--hostfil", "f", "a.out"], "--hostfil"),
        (["mpirun", "--np=8", "a.out"], "--np"),
    ],
)
def test_mpirun_refuses_what_would_move_a_rank_off_its_line(command: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        launch("mpi", command, order=ORDER, node_rank=None, master_addr="a", slots=2, hostfile_path="/t/h")
    assert caught.value.field == field


def test_an_option_after_the_program_is_the_programs() -> None:
    command = ["mpirun", "--mca", "btl", "tcp,self", "python", "train.py", "-H", "x", "--map-by", "y"]
    assert launch("mpi", command, order=ORDER, node_rank=None, master_addr="a").argv[-4:] == tuple(command[-4:])
    srun = ["srun", "-w", "gpu01,gpu02", "--label", "-n4", "bash", "-c", "echo -m"]
    assert launch("slurm", srun, order=ORDER, node_rank=None, master_addr="a").argv[2:] == tuple(srun[1:])


@pytest.mark.parametrize(
    ("command", "field"),
    [
        (["srun", "-w", "gpu01", "-m", "block", "a.out"], "-m"),
        (["srun", "--ntasks-per-node", "8", "--distribution=cyclic", "a.out"], "--distribution"),
        (["srun", "-lmblock", "a.out"], "-m"),
        (["srun", "--distrib=block", "a.out"], "--distrib"),
        (["torchrun", "--nproc_per_node", "8", "--nnodes", "2", "t.py"], "--nnodes"),
        (["torchrun", "--rdzv_conf", "timeout=5", "--node_rank", "1", "t.py"], "--node_rank"),
        (["torchrun", "--node_r=1", "t.py"], "--node_r"),
    ],
)
def test_a_refused_option_behind_a_multi_word_one_is_still_refused(command: list[str], field: str) -> None:
    flavour = "slurm" if command[0] == "srun" else "torchrun"
    with pytest.raises(ConfigError) as caught:
        launch(flavour, command, order=ORDER, node_rank=0, master_addr="a", hostfile_path="/t/h")
    assert caught.value.field == field


def test_slots_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="--slots"):
        launch("mpi", ["mpirun", "a.out"], order=ORDER, node_rank=None, master_addr="a", slots=0)
