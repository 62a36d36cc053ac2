"""A job's node order handed to its launcher: torchrun's flags, Slurm's arbitrary distribution, an MPI hostfile.

NCCL's inter-node ring follows the order of each node's lowest global rank, so the order reaches NCCL only if
the launcher hands out ranks in it. Each launcher reads that from somewhere else:

- ``torchrun`` (static rendezvous): ``--node_rank``/``--nnodes``/``--master_addr``, given on every node.
  torchrun's elastic rendezvous (``--rdzv-backend c10d`` and the like) assigns ranks by arrival instead, and
  ``--standalone`` is one node: both are refused rather than silently ignored.
- ``srun``: ``SLURM_HOSTFILE`` (one line per task, in rank order) with ``--distribution=arbitrary``.
- ``mpirun``: a hostfile listing the nodes in order with their slots; Open MPI's default by-slot mapping
  keeps each node's ranks contiguous.

A flag the mapping sets itself, already on the command line, is an error naming it: two answers to "which
rank am I" is how a job ends up with the launcher's order after all. Everything here is pure; the CLI writes
the hostfile and runs the command.

Non-goals: starting processes on other nodes (the user's launcher does) and choosing the order
(``tuner/ring/job_order.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from topo_tune.errors import ConfigError
from topo_tune.tuner.ring.rank_map import hostfile_body

LauncherFlavour = Literal["torchrun", "mpi", "slurm"]
LAUNCHERS: tuple[LauncherFlavour, ...] = ("torchrun", "mpi", "slurm")

_TORCHRUN_SET = ("--node_rank", "--node-rank", "--nnodes", "--master_addr", "--master-addr")
_TORCHRUN_REFUSED = ("--standalone",)
_STATIC = ("static", "")
_SRUN_SET = ("--distribution", "-m")
_MPI_RUNNERS = ("mpirun", "mpiexec", "orterun", "prterun")
_PROGRAMS = ("bash", "sh", "env", "topo-tune")
_MPI_SET = ("--hostfile", "-hostfile", "--machinefile", "-machinefile", "--host", "-host", "-H")


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
        _refuse(command[at + 1 :], _TORCHRUN_SET + _TORCHRUN_REFUSED, "torchrun")
        backend = _value(command[at + 1 :], ("--rdzv-backend", "--rdzv_backend"))
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
        _refuse(command[1:], _SRUN_SET, "srun")
        return Launch(
            argv=(command[0], "--distribution=arbitrary", *command[1:]),
            env={"SLURM_HOSTFILE": hostfile_path},
            hostfile=hostfile_body("slurm", order, slots),
        )
    if flavour == "mpi":
        if os.path.basename(command[0]) not in _MPI_RUNNERS:
            runners = "/".join(_MPI_RUNNERS)
            raise ConfigError("--launcher", f"mpi: the command must start with {runners}, not {command[0]!r}")
        _refuse(command[1:], _MPI_SET, command[0])
        argv = (command[0], "--hostfile", hostfile_path, *command[1:])
        return Launch(argv=argv, hostfile=hostfile_body("mpi", order, slots))
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


def _launcher_args(args: Sequence[str]) -> Sequence[str]:
    """The launcher's own arguments: those before the program it runs.

    Without each launcher's option table a value cannot always be told from a program name, so the program
    is taken to start at ``--``, at a script (``*.py``), at an interpreter or ``topo-tune``, or at the second
    first argument that is neither an option nor the value of one (one that follows an option without ``=``).
    """
    for index, arg in enumerate(args):
        base = os.path.basename(arg)
        previous = args[index - 1] if index else "="
        program_may_start = not previous.startswith("-") or "=" in previous
        if arg == "--" or arg.endswith(".py") or base.startswith("python") or base in _PROGRAMS:
            return args[:index]
        if not arg.startswith("-") and program_may_start:
            return args[:index]
    return args


def _refuse(args: Sequence[str], flags: Sequence[str], launcher: str) -> None:
    for arg in _launcher_args(args):
        name = arg.split("=", 1)[0]
        if name in flags:
            raise ConfigError(name, f"--launcher sets it for {launcher} from the job's order: remove it")


def _value(args: Sequence[str], names: Sequence[str]) -> str:
    own = list(_launcher_args(args))
    for index, arg in enumerate(own):
        name, sep, value = arg.partition("=")
        if name in names:
            return value if sep else (own[index + 1] if index + 1 < len(own) else "")
    return ""
