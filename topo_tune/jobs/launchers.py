"""A job's node order handed to its launcher: torchrun's flags, Slurm's arbitrary distribution, an MPI hostfile.

NCCL's inter-node ring follows the order of each node's lowest global rank, so the order reaches NCCL only if
the launcher hands out ranks in it. Each launcher reads that from somewhere else:

- ``torchrun`` (static rendezvous): ``--node_rank``/``--nnodes``/``--master_addr``, given on every node.
  torchrun's elastic rendezvous (``--rdzv-backend c10d`` and the like) assigns ranks by arrival instead, and
  ``--standalone`` is one node: both are refused rather than silently ignored.
- ``srun``: ``SLURM_HOSTFILE`` (one line per task, in rank order) with ``--distribution=arbitrary``.
- ``mpirun``: a hostfile with one line per rank, in rank order, read by Open MPI's sequential mapper
  (``--mca rmaps seq``), and ``-np`` its line count. The default by-slot mapping would not do: it starts on
  mpirun's own node, and inside a Slurm allocation the hostfile only filters the allocation's nodes, keeping
  Slurm's order. The seq mapper is passed over silently when a per-node count (``-npernode``, ``--ppr``, ``-N``)
  or another mapping is asked for, so those are refused; a ``-np`` other than the line count would leave
  nodes out (fewer) or fail (more), so it is refused too.

A flag the mapping sets itself, already on the command line, is an error naming it: two answers to "which
rank am I" is how a job ends up with the launcher's order after all. The launcher's own options are read with
its option table (``topo_tune.jobs.launcher_options``), so none hides behind another's value. Everything here
is pure; the CLI writes the hostfile and runs the command.

Non-goals: starting processes on other nodes (the user's launcher does) and choosing the order
(``tuner/ring/job_order.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from topo_tune.errors import ConfigError
from topo_tune.jobs.launcher_options import OPEN_MPI, SRUN, TORCHRUN, LauncherArgs, split_args
from topo_tune.tuner.ring.rank_map import hostfile_body

LauncherFlavour = Literal["torchrun", "mpi", "slurm"]
LAUNCHERS: tuple[LauncherFlavour, ...] = ("torchrun", "mpi", "slurm")

_TORCHRUN_SET = ("--node_rank", "--node-rank", "--nnodes", "--master_addr", "--master-addr")
_TORCHRUN_REFUSED = ("--standalone",)
_STATIC = ("static", "")
_SRUN_SET = ("--distribution", "-m")
_MPI_RUNNERS = ("mpirun", "mpiexec", "orterun", "prterun")
_MPI_SET = (
    *("--hostfile", "-hostfile", "--machinefile", "-machinefile", "--host", "-host", "-H", "--app", "-am"),
    *("-default-hostfile", "--default-hostfile", "-rf", "--rankfile", "--map-by", "--rank-by", "--ppr", "-N"),
    *("-npernode", "--npernode", "-npersocket", "--npersocket", "-pernode", "--pernode", "-nolocal", "--nolocal"),
    *("-bynode", "--bynode", "-byslot", "--byslot", "-bycore", "--bycore"),
)
"""What would move a rank off its hostfile line: other hosts, another mapper or ranking, a per-node count (the
seq mapper then steps aside), or leaving mpirun's own node out."""
_MPI_COUNT = ("-np", "--np", "-n", "--n", "-c")
_MCA = ("--mca", "-mca", "--gmca", "-gmca")


@dataclass(frozen=True)
class Launch:
    """What to run: the argv, variables to add, and a hostfile to write first (None: none)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    hostfile: str | None = None


def starts_other_nodes(flavour: LauncherFlavour | None) -> bool:
    """Whether the launcher itself starts the job's other nodes (so this node's rank means nothing to them)."""
    return flavour in ("mpi", "slurm")


def launch(
    flavour: LauncherFlavour,
    command: Sequence[str],
    *,
    order: Sequence[str],
    node_rank: int | None,
    master_addr: str,
    slots: int = 1,
    hostfile_path: str = "",
) -> Launch:
    """The command ``flavour`` needs to start the job in ``order``; ``hostfile_path`` is where the CLI writes
    ``Launch.hostfile`` (mpi and slurm). Raises `ConfigError` naming the flag that conflicts."""
    if not command:
        raise ConfigError("COMMAND", "nothing to run")
    if slots < 1:
        raise ConfigError("--slots", f"must be at least 1, got {slots}")
    if flavour == "torchrun":
        if node_rank is None:
            raise ConfigError("--node", "torchrun needs this node's rank: run exec on every node of the job")
        at = _torchrun_at(command)
        own = split_args(command[at + 1 :], TORCHRUN)
        _refuse(own, _TORCHRUN_SET + _TORCHRUN_REFUSED, "torchrun")
        backend = _value(own, ("--rdzv-backend", "--rdzv_backend"))
        if backend not in _STATIC:
            raise ConfigError(
                "--rdzv-backend",
                f"torchrun's {backend!r} rendezvous assigns node ranks by arrival, not in the job's order: "
                "leave it out (the static rendezvous reads --node_rank)",
            )
        flags = (f"--node_rank={node_rank}", f"--nnodes={len(order)}", f"--master_addr={master_addr}")
        return Launch(argv=(*command[: at + 1], *flags, *command[at + 1 :]))
    if flavour == "slurm":
        if os.path.basename(command[0]) != "srun":
            raise ConfigError("--launcher", f"slurm: the command must start with srun, not {command[0]!r}")
        _refuse(split_args(command[1:], SRUN), _SRUN_SET, "srun")
        return Launch(
            argv=(command[0], "--distribution=arbitrary", *command[1:]),
            env={"SLURM_HOSTFILE": hostfile_path},
            hostfile=hostfile_body("slurm", order, slots),
        )
    if flavour == "mpi":
        if os.path.basename(command[0]) not in _MPI_RUNNERS:
            runners = "/".join(_MPI_RUNNERS)
            raise ConfigError("--launcher", f"mpi: the command must start with {runners}, not {command[0]!r}")
        own = split_args(command[1:], OPEN_MPI)
        _refuse(own, _MPI_SET, command[0])
        for option in own.options:
            if option.name in _MCA and option.values[0].startswith("rmaps"):
                raise ConfigError(
                    f"{option.name} {option.values[0]}",
                    "--launcher mpi maps ranks with the sequential mapper (--mca rmaps seq): remove it",
                )
        ranks = len(order) * slots
        count = own.first(_MPI_COUNT)
        if count is not None and count.values[0] != str(ranks):
            raise ConfigError(
                count.name,
                f"the job's hostfile has {ranks} ranks ({len(order)} nodes x --slots {slots}), "
                f"not {count.values[0]}: give -np {ranks} or leave it out",
            )
        np_args = () if count is not None else ("-np", str(ranks))  # Open MPI 4.1's seq mapper needs it
        argv = (command[0], "--mca", "rmaps", "seq", "--hostfile", hostfile_path, *np_args, *command[1:])
        # One line per rank, in rank order: the form srun's SLURM_HOSTFILE takes too.
        return Launch(argv=argv, hostfile=hostfile_body("slurm", order, slots))
    raise ConfigError("--launcher", f"must be one of {', '.join(LAUNCHERS)}, got {flavour!r}")


def _torchrun_at(command: Sequence[str]) -> int:
    """Where torchrun's own flags start: after ``torchrun`` or ``python -m torch.distributed.run``."""
    if os.path.basename(command[0]) == "torchrun":
        return 0
    for index in range(len(command) - 1):
        if command[index] == "-m" and command[index + 1] == "torch.distributed.run":
            return index + 1
    raise ConfigError(
        "--launcher",
        f"torchrun: the command must start with torchrun or python -m torch.distributed.run, not {command[0]!r}",
    )


def _refuse(options: LauncherArgs, flags: Sequence[str], launcher: str) -> None:
    for option in options.options:
        if option.name in flags:
            raise ConfigError(option.name, f"--launcher sets it for {launcher} from the job's order: remove it")


def _value(options: LauncherArgs, names: Sequence[str]) -> str:
    option = options.first(names)
    return option.values[0] if option is not None and option.values else ""
