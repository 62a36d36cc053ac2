"""``topo-tune exec``: run a job's command with its pinned config version and node order, or its own A/B.

``exec`` checks what ``env`` checks (the version staged here, unchanged; with ``--launcher slurm|mpi``, whose
host need not be a job node, only unchanged where staged), then replaces itself with the command
while holding a shared lock on this node's ``jobs.lock`` (inherited by the command and its children), so the
agent never changes this node's config under the job. ``--launcher`` hands the order to torchrun, srun or
mpirun (``topo_tune.jobs.launchers``); ``--compare`` runs the job's own A/B (``topo_tune.cli.compare``).
srun and mpirun read a hostfile that ``exec`` writes: they run as its child, not in its place, so that the
hostfile's private directory is removed when they end (``_run_then_remove``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn, cast

import click

from topo_tune.agent.config_store import ConfigStore, jobs_lock_shared
from topo_tune.cli.admin import connected
from topo_tune.cli.child_process import end_as, run_child
from topo_tune.cli.compare import ArmConfig, compare_options, run_comparison, spec_from_options
from topo_tune.cli.job import (
    check_staged,
    check_unchanged,
    job_nodes,
    job_options,
    job_variables,
    resolve_job,
    this_node,
    warn,
)
from topo_tune.cli.job_timing import run_and_ship
from topo_tune.client.admin import AdminClient
from topo_tune.jobs.config import job_id_from_env
from topo_tune.jobs.job_config import JobConfig
from topo_tune.jobs.launchers import LAUNCHERS, LauncherFlavour, launch, starts_other_nodes
from topo_tune.learning.assignment import job_opted_out
from topo_tune.plugin.job_env import workload_env
from topo_tune.security.safe_write import write_file


def compare_arm(
    client: AdminClient, name: str, *, job_id: str, nodes: list[str], config_dir: Path, tuner_plugin: Path | None
) -> ArmConfig:
    """An arm of ``exec --compare`` (a version id, "stable" or "defaults"): its version and node order as the
    controller pins them for (job id, arm), so every node runs each arm with one version and one order; the
    version must be staged here, unchanged. TOPO_TUNE_NODE_RANK is the caller's (per run)."""
    config = client.resolve_job_config(job_id, nodes, arm=name)
    warn(config)
    if config.config_version:
        ConfigStore(config_dir).read(config.config_version)  # ConflictError: not staged here, or changed
    variables = job_variables(config, job_id=job_id, config_dir=config_dir, tuner_plugin=tuner_plugin, node=None)
    return ArmConfig(name=name, version=config.config_version, order=config.node_order, variables=variables)


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@job_options
@compare_options
@click.option(
    "--launcher",
    type=click.Choice(LAUNCHERS),
    default=None,
    help="Hand the job's order to COMMAND's launcher: torchrun (adds --node_rank/--nnodes/--master_addr; run "
    "on every node), slurm (srun: SLURM_HOSTFILE + --distribution=arbitrary), mpi (mpirun --hostfile).",
)
@click.option(
    "--slots",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks per node in the slurm/mpi hostfile. Default: $SLURM_NTASKS_PER_NODE, else 1.",
)
@connected
@click.option(
    "--record-workload",
    "record_workload",
    type=click.Path(path_type=Path, file_okay=False),
    help="Count the job's collectives in the tuner plugin (needs --tuner-plugin) and write them into this "
    "directory as each communicator ends; topo-tune workload import reads them (docs/workload.md).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(
    client: AdminClient,
    fmt: str,
    node_args: tuple[str, ...],
    node: str,
    job_id: str,
    config_dir: Path,
    tuner_plugin: Path | None,
    candidate: str,
    against: str,
    pairs: int,
    metric: str,
    higher_is_better: bool,
    record_wait: float,
    record_workload: Path | None,
    launcher: str | None,
    slots: int | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND with the job's pinned config and node order: topo-tune exec [--nodes ...] -- CMD ARGS...

    \b
    COMMAND gets the variables `topo-tune env` prints (TOPO_TUNE_NODE_RANK ... included); with --launcher
    they become what the launcher reads:
    torchrun:  topo-tune exec --launcher torchrun --job-id "$RUN" --nodes "$NODES" -- \\
                   torchrun --nproc_per_node=8 train.py
               (on every node, one RUN per run of the job; torchrun gets --node_rank, --nnodes, --master_addr)
    Slurm:     topo-tune exec --launcher slurm --slots 8 -- \\
                   srun --ntasks="$((SLURM_NNODES * 8))" topo-tune exec -- python train.py
               (once, in the batch script; srun starts the tasks in the job's order, so SLURM_PROCID follows
               it while SLURM_NODEID keeps Slurm's; the inner exec checks each node has the version)
    Open MPI:  topo-tune exec --launcher mpi --job-id "$RUN" --nodes "$NODES" --slots 8 -- \\
                   mpirun -x TOPO_TUNE_JOB_ID -x TOPO_TUNE_NODES -x TOPO_TUNE_CONTROLLER -x TOPO_TUNE_TOKEN \\
                   topo-tune exec -- python train.py
               (once, on any host; one hostfile line per rank, Open MPI's sequential mapper; -x hands
               the inner exec on each rank the job id, its nodes, the controller and its token)
    Kubernetes: set TOPO_TUNE_JOB_ID from the Job's uid (downward API) and TOPO_TUNE_NODES; docs/job-order.md.

    \b
    The job's own A/B, started on every node like plain exec (COMMAND runs 2 x PAIRS times, the arms
    interleaved in an order every node derives from the job id):
      topo-tune exec --compare stable --against defaults --pairs 5 --metric 'step_time=([0-9.]+)' \\
          -- torchrun ... train.py
    Each run gets its arm's NCCL files and node order; node rank 0 of each run reads the metric (the
    last match, group 1; lower is better unless --higher-is-better); the figures (median per arm, gain,
    CI, the tuner's proof statistics) are printed and recorded: topo-tune admin job comparisons.

    \b
    Learning (docs/learning.md; off unless cluster.yaml's learning.enabled): with --tuner-plugin, a job of a
    version that carries challenger tables may run one of them (its arm, pinned with the job) and is timed
    by the plugin's profiler; exec then runs COMMAND as its child and, when it ends, ships this node's timing
    records to the controller. TOPO_TUNE_LEARNING=off in the job's environment opts it out.
    """
    flavour = cast("LauncherFlavour | None", launcher)
    if record_workload is not None and tuner_plugin is None:
        raise click.UsageError("--record-workload needs --tuner-plugin: the plugin counts the calls")
    if record_workload is not None and (candidate or against):
        raise click.UsageError("--record-workload records a plain exec run, not a --compare")
    if candidate or against or metric or higher_is_better:
        if flavour is not None:
            raise click.UsageError(
                "--launcher and --compare: the arms' orders differ, so pass each run's rank from its variables, "
                "e.g. -- bash -c 'torchrun --node_rank=$TOPO_TUNE_NODE_RANK --nnodes=$TOPO_TUNE_NNODES ...'"
            )
        spec = spec_from_options(
            candidate=candidate,
            against=against,
            pairs=pairs,
            metric=metric,
            higher_is_better=higher_is_better,
            record_wait=record_wait,
        )
        job = job_id or job_id_from_env(os.environ)
        if not job:
            raise click.UsageError("no job id: pass --job-id or run under Slurm, torchrun or MPI")
        nodes = job_nodes(node_args, os.environ, job_id=job)
        lock = jobs_lock_shared(config_dir)
        if lock is not None:
            os.set_inheritable(lock, True)  # held for every run of the comparison
        plugin = tuner_plugin.absolute() if tuner_plugin is not None else None
        status = run_comparison(
            client,
            spec=spec,
            job_id=job,
            nodes=nodes,
            node=this_node(node, os.environ, config_dir),
            resolve=lambda name: compare_arm(
                client, name, job_id=job, nodes=nodes, config_dir=config_dir, tuner_plugin=plugin
            ),
            command=command,
            environ=os.environ,
        )
        sys.exit(status)
    here = None if starts_other_nodes(flavour) else this_node(node, os.environ, config_dir)
    config, variables = resolve_job(
        client,
        node_args=node_args,
        job_id=job_id,
        config_dir=config_dir,
        tuner_plugin=tuner_plugin,
        node=here,
        may_learn=tuner_plugin is not None and not job_opted_out(os.environ),  # exec ships the timing records
    )
    lock = jobs_lock_shared(config_dir)
    if lock is not None:
        os.set_inheritable(lock, True)  # the command and its children keep the node's config from changing
    if starts_other_nodes(flavour):
        # srun/mpirun may start from a host that is not one of the job's nodes (salloc on a login node, mpirun
        # from a host without an agent): each node's inner exec checks its own staging. Staged here too, the
        # files must still hash to the version (a changed file is refused wherever it is found).
        check_unchanged(config, variables["NCCL_CONF_FILE"], config_dir)
    else:
        check_staged(config, variables["NCCL_CONF_FILE"], config_dir)
    if record_workload is not None:
        assert tuner_plugin is not None
        try:
            variables = workload_env(record_workload, tuner_plugin, variables)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--record-workload") from None
    timing = None
    if config.learning and tuner_plugin is not None and here is not None:  # the ranks run here: time them
        timing = record_workload or Path(tempfile.mkdtemp(prefix="topo-tune-timing-"))
        variables = workload_env(timing, tuner_plugin, variables)
    argv = list(command)
    sys.stdout.flush()
    if flavour is not None and starts_other_nodes(flavour):
        directory = Path(tempfile.mkdtemp(prefix=f"topo-tune-{_safe(config.job_id)}-"))
        try:
            argv = _launch(flavour, argv, config, variables, slots=slots, hostfile=directory / "hostfile")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        # The ranks' inner exec asks about the same nodes (mpirun: -x TOPO_TUNE_NODES; srun passes it on).
        variables.setdefault("TOPO_TUNE_NODES", ",".join(config.node_order))
        _run_then_remove(argv, {**os.environ, **variables}, directory=directory)
    if flavour is not None:
        argv = _launch(flavour, argv, config, variables, slots=slots, hostfile=None)
    if timing is not None and here is not None:
        env = {**os.environ, **variables}
        own = record_workload is None
        run_and_ship(argv, env, client=client, job_id=config.job_id, node=here, directory=timing, own=own)
    try:
        os.execvpe(argv[0], argv, {**os.environ, **variables})
    except OSError as error:
        raise click.ClickException(f"cannot run {argv[0]!r}: {error.strerror}") from None


def _run_then_remove(argv: list[str], env: dict[str, str], *, directory: Path) -> NoReturn:
    """Run the launcher as a child, passing signals on, then remove ``directory`` (its hostfile) and end as
    the launcher ended: its exit status, or killed by the same signal."""
    try:
        status = run_child(argv, env)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    end_as(status)


def _launch(
    flavour: LauncherFlavour,
    command: list[str],
    config: JobConfig,
    variables: dict[str, str],
    *,
    slots: int | None,
    hostfile: Path | None,
) -> list[str]:
    """COMMAND as ``flavour`` needs it; writes its hostfile (mpi, slurm) at ``hostfile``."""
    rank = variables.get("TOPO_TUNE_NODE_RANK")
    count = slots if slots is not None else _slots_from_env(os.environ)
    planned = launch(
        flavour,
        command,
        order=list(config.node_order),
        node_rank=int(rank) if rank is not None else None,
        master_addr=config.master_addr,
        slots=count,
        hostfile_path=str(hostfile) if hostfile is not None else "",
    )
    if planned.hostfile is not None:
        assert hostfile is not None, "mpi and slurm are given a hostfile path"
        write_file(hostfile, planned.hostfile)
    variables.update(planned.env)
    return list(planned.argv)


def _slots_from_env(environ: Mapping[str, str]) -> int:
    value = environ.get("SLURM_NTASKS_PER_NODE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40]
