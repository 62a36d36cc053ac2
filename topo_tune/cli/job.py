"""``topo-tune env`` / ``exec`` / ``hostfile``: give a job the one config version its nodes allow and its node
order, pinned for its life.

Besides the NCCL variables, ``env`` and ``exec`` name this node's place in the job's order
(``TOPO_TUNE_NODE_RANK``, ``TOPO_TUNE_NNODES``, ``TOPO_TUNE_MASTER_ADDR``, ``TOPO_TUNE_NODE_ORDER``); ``exec
--launcher`` hands the order to torchrun, srun or mpirun (``topo_tune.jobs.launchers``); ``hostfile`` prints a
launcher's hostfile for the job's nodes with the predicted ring bottleneck next to the launcher's own order's.

``env`` prints ``export KEY=VALUE`` lines (``eval "$(topo-tune env ...)"``); ``exec`` runs the command with
them. Both first check that the version's files are staged on this node (a rank that silently fell back to
NCCL's defaults would disagree with the job's other ranks) and that their content still hashes to the version's
id (a changed file is refused). ``exec`` replaces
itself with the command while holding a shared lock on this node's ``jobs.lock`` (inherited by the command and
its children), so the agent never changes this node's config under the job.
"""

from __future__ import annotations

import math
import os
import shlex
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import click

from topo_tune.agent.config_store import ConfigStore, jobs_lock_shared
from topo_tune.cli.admin import connected
from topo_tune.cli.compare import ArmConfig, compare_options, run_comparison, spec_from_options
from topo_tune.cli.output import emit_data
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ConfigError, ConflictError
from topo_tune.jobs.config import (
    RolloutView,
    arm_version,
    expand_hostlist,
    job_environment,
    job_id_from_env,
    nodes_from_env,
    order_environment,
)
from topo_tune.jobs.launchers import LAUNCHERS, LauncherFlavour, launch, starts_other_nodes
from topo_tune.plugin.job_env import workload_env
from topo_tune.tuner.ring.job_order import METHODS
from topo_tune.tuner.ring.rank_map import HostfileFlavour, hostfile_body
from topo_tune.v1 import admin_pb2
from topo_tune.versions.layout import DEFAULT_CONFIG_DIR, NODE_NAME_FILE


def _nodes_option(function: Any) -> Any:
    return click.option(
        "--nodes",
        "node_args",
        multiple=True,
        metavar="HOSTS",
        help="The job's nodes: repeat, comma-separate or Slurm ranges (gpu[01-04]). "
        "Default: $TOPO_TUNE_NODES, then $SLURM_JOB_NODELIST. Their order does not matter.",
    )(function)


def _job_options(function: Any) -> Any:
    function = _nodes_option(function)
    function = click.option(
        "--node",
        "node",
        default="",
        metavar="NAME",
        help="The node this runs on, as the agent names it. Default: $TOPO_TUNE_NODE_NAME, then the name this "
        "host's agent registered (CONFIG_DIR/node-name), then the host name.",
    )(function)
    function = click.option(
        "--job-id",
        default="",
        help="Default: $TOPO_TUNE_JOB_ID, $SLURM_JOB_ID, $TORCHELASTIC_RUN_ID, $PMIX_NAMESPACE.",
    )(function)
    function = click.option(
        "--config-dir",
        type=click.Path(path_type=Path, file_okay=False),
        envvar="TOPO_TUNE_CONFIG_DIR",
        default=DEFAULT_CONFIG_DIR,
        show_default=True,
        help="Where the agents stage config versions [$TOPO_TUNE_CONFIG_DIR].",
    )(function)
    return click.option(
        "--tuner-plugin",
        type=click.Path(path_type=Path, dir_okay=False),
        envvar="TOPO_TUNE_TUNER_PLUGIN",
        help="The tuner plugin library; loaded when the version has a tuner table [$TOPO_TUNE_TUNER_PLUGIN].",
    )(function)


def _nodes(node_args: tuple[str, ...], environ: Mapping[str, str]) -> list[str]:
    nodes = [host for arg in node_args for host in expand_hostlist(arg)]
    if not nodes:
        nodes = nodes_from_env(environ)
    if not nodes:
        raise click.UsageError("no nodes: pass --nodes HOSTS (torchrun and mpirun do not export a node list)")
    return nodes


def this_node(option: str, environ: Mapping[str, str], config_dir: Path) -> str:
    """The node this runs on: ``--node``, ``$TOPO_TUNE_NODE_NAME``, the agent's recorded name, the host name."""
    if option:
        return option
    if environ.get("TOPO_TUNE_NODE_NAME"):
        return environ["TOPO_TUNE_NODE_NAME"]
    try:
        recorded = (config_dir / NODE_NAME_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = ""
    return recorded or socket.gethostname()


def _resolve(
    client: AdminClient,
    *,
    node_args: tuple[str, ...],
    job_id: str,
    config_dir: Path,
    tuner_plugin: Path | None,
    node: str | None,
    arm: str = "",
) -> tuple[admin_pb2.JobConfig, dict[str, str]]:
    """The job's config and its variables; ``node`` None: no TOPO_TUNE_NODE_RANK (a launcher starts the others)."""
    environ = os.environ
    job_id = job_id or job_id_from_env(environ)
    if not job_id:
        raise click.UsageError("no job id: pass --job-id or run under Slurm, torchrun or MPI")
    config = client.resolve_job_config(job_id, _nodes(node_args, environ), arm=arm)
    _warn(config)
    if "nccl_tuner.conf" in config.files and tuner_plugin is None:
        click.echo("topo-tune: warning: the version has a tuner table but no --tuner-plugin was given", err=True)
    if tuner_plugin is not None:
        tuner_plugin = tuner_plugin.absolute()
    env = job_environment(
        config.config_version,
        config_dir=config_dir.absolute(),
        files=list(config.files),
        tuner_plugin=tuner_plugin,
        job_id=job_id,
    )
    env.update(order_environment(config.node_order, node=node, master_addr=config.master_addr))
    return config, env


def _warn(config: admin_pb2.JobConfig) -> None:
    for warning in config.warnings:
        click.echo(f"topo-tune: warning: {warning}", err=True)


def _check_content(config_dir: Path, version: str) -> None:
    """Refuse to hand out a staged version whose files no longer hash to its id (changed after staging)."""
    if not version:
        return
    try:
        ConfigStore(config_dir).read(version)
    except ConflictError as error:
        raise click.ClickException(
            f"{error}; not handing it to a job (the agent reports it and the controller re-applies it)"
        ) from None


def _check_staged(config: admin_pb2.JobConfig, conf: str, config_dir: Path) -> None:
    """Refuse a version that is not staged (or changed) in this node's ``config_dir``: NCCL would silently run on
    its defaults here while the job's other ranks use the version (a hang, or numbers that disagree)."""
    if not os.path.exists(conf):
        raise click.ClickException(
            f"{config.config_version} is not staged on this node ({conf} is missing; is --config-dir the agent's "
            f"--config-dir?); not handing a rank an NCCL config that would differ from the others'"
        )
    _check_content(config_dir, config.config_version)


@click.command()
@_job_options
@connected
def env(
    client: AdminClient,
    fmt: str,
    node_args: tuple[str, ...],
    node: str,
    job_id: str,
    config_dir: Path,
    tuner_plugin: Path | None,
) -> None:
    """Print the environment of a job on these nodes: eval "$(topo-tune env --nodes ...)".

    \b
    Every rank of the job gets the same config version: the rollout's new one only if all the job's
    nodes are in completed waves, otherwise the previous stable one; the answer is pinned to the job id,
    with the job's node order (the best ring over its nodes on the version's pair matrix).
    Besides NCCL_CONF_FILE and friends, for the node it runs on (--node):
      TOPO_TUNE_NODE_RANK    this node's place in the order (0 ... NNODES-1)
      TOPO_TUNE_NNODES       how many nodes the job has
      TOPO_TUNE_MASTER_ADDR  the address node rank 0's agent registered
      TOPO_TUNE_NODE_ORDER   the job's nodes in rank order, comma-separated
    \b
    torchrun:   eval "$(topo-tune env --nodes "$NODES")"
                torchrun --node_rank=$TOPO_TUNE_NODE_RANK --nnodes=$TOPO_TUNE_NNODES \\
                         --master_addr=$TOPO_TUNE_MASTER_ADDR --nproc_per_node=8 train.py
    Kubernetes: the pod asks for its rank (JOB_COMPLETION_INDEX is not the rank); docs/job-order.md.
    """
    here = this_node(node, os.environ, config_dir)
    config, variables = _resolve(
        client, node_args=node_args, job_id=job_id, config_dir=config_dir, tuner_plugin=tuner_plugin, node=here
    )
    _check_staged(config, variables["NCCL_CONF_FILE"], config_dir)
    if fmt != "table":
        emit_data(
            {
                "job_id": config.job_id,
                "config_version": config.config_version,
                "env": variables,
                "order": _order_data(config),
            },
            fmt,
        )
        return
    for key, value in variables.items():
        click.echo(f"export {key}={shlex.quote(value)}")


def compare_arm(
    client: AdminClient, name: str, *, job_id: str, nodes: list[str], config_dir: Path, tuner_plugin: Path | None
) -> ArmConfig:
    """An arm of ``exec --compare`` (a version id, "stable" or "defaults"): its version and node order as the
    controller pins them for (job id, arm), so every node runs each arm with one version and one order; the
    version must be staged here, unchanged. TOPO_TUNE_NODE_RANK is the caller's (per run)."""
    config = client.resolve_job_config(job_id, nodes, arm=name)
    _warn(config)
    if config.config_version:
        ConfigStore(config_dir).read(config.config_version)  # ConflictError: not staged here, or changed
    variables = job_environment(
        config.config_version,
        config_dir=config_dir.absolute(),
        files=list(config.files),
        tuner_plugin=tuner_plugin,
        job_id=job_id,
    )
    variables.update(order_environment(config.node_order, node=None, master_addr=config.master_addr))
    return ArmConfig(name=name, version=config.config_version, order=tuple(config.node_order), variables=variables)


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@_job_options
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
    torchrun:  topo-tune exec --launcher torchrun --nodes "$NODES" -- torchrun --nproc_per_node=8 train.py
               (on every node; torchrun gets --node_rank, --nnodes and --master_addr)
    Slurm:     topo-tune exec --launcher slurm -- srun --ntasks-per-node=8 python train.py
               (once, in the batch script; srun starts the ranks in the job's order)
    Open MPI:  topo-tune exec --launcher mpi --nodes "$NODES" --slots 8 -- mpirun -np 32 python train.py
    Kubernetes: set TOPO_TUNE_JOB_ID from the Job's uid (downward API) and TOPO_TUNE_NODES; docs/job-order.md.

    \b
    The job's own A/B, started on every node like plain exec (COMMAND runs 2 x PAIRS times, the arms
    interleaved in an order every node derives from the job id):
      topo-tune exec --compare stable --against defaults --pairs 5 --metric 'step_time=([0-9.]+)' \\
          -- torchrun ... train.py
    Each run gets its arm's NCCL files and node order; node rank 0 of each run reads the metric (the
    last match, group 1; lower is better unless --higher-is-better); the figures (median per arm, gain,
    CI, the tuner's proof statistics) are printed and recorded: topo-tune admin job comparisons.
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
        nodes = _nodes(node_args, os.environ)
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
    config, variables = _resolve(
        client, node_args=node_args, job_id=job_id, config_dir=config_dir, tuner_plugin=tuner_plugin, node=here
    )
    lock = jobs_lock_shared(config_dir)
    if lock is not None:
        os.set_inheritable(lock, True)  # the command and its children keep the node's config from changing
    _check_staged(config, variables["NCCL_CONF_FILE"], config_dir)
    if record_workload is not None:
        assert tuner_plugin is not None
        try:
            variables = workload_env(record_workload, tuner_plugin, variables)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--record-workload") from None
    argv = list(command)
    if flavour is not None:
        argv = _launch(flavour, argv, config, variables, slots=slots)
    sys.stdout.flush()
    try:
        os.execvpe(argv[0], argv, {**os.environ, **variables})
    except OSError as error:
        raise click.ClickException(f"cannot run {argv[0]!r}: {error.strerror}") from None


def _launch(
    flavour: LauncherFlavour,
    command: list[str],
    config: admin_pb2.JobConfig,
    variables: dict[str, str],
    *,
    slots: int | None,
) -> list[str]:
    """COMMAND as ``flavour`` needs it; writes its hostfile (mpi, slurm) into a new private directory."""
    rank = variables.get("TOPO_TUNE_NODE_RANK")
    count = slots if slots is not None else _slots_from_env(os.environ)
    path = ""
    if starts_other_nodes(flavour):
        path = str(Path(tempfile.mkdtemp(prefix=f"topo-tune-{_safe(config.job_id)}-")) / "hostfile")
    planned = launch(
        flavour,
        command,
        order=list(config.node_order),
        node_rank=int(rank) if rank is not None else None,
        master_addr=config.master_addr,
        slots=count,
        hostfile_path=path,
    )
    if planned.hostfile is not None:
        Path(path).write_text(planned.hostfile, encoding="utf-8")
    variables.update(planned.env)
    return list(planned.argv)


def _slots_from_env(environ: Mapping[str, str]) -> int:
    value = environ.get("SLURM_NTASKS_PER_NODE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40]


def _order_data(config: admin_pb2.JobConfig) -> dict[str, object]:
    return {
        "node_order": list(config.node_order),
        "method": config.order_method,
        "predicted_bottleneck_gbps": _prediction(config.order_bottleneck_gbps),
        "launcher_order_bottleneck_gbps": _prediction(config.given_bottleneck_gbps),
        "measured_edges": config.measured_edges,
        "ring_edges": config.ring_edges,
        "master_addr": config.master_addr,
        "warnings": list(config.warnings),
    }


def _prediction(value: float) -> float | None:
    return value if value and math.isfinite(value) else None


def hostfile_comment(config: admin_pb2.JobConfig) -> str:
    """The hostfile's head: which version and order, and its predicted ring bottleneck vs the launcher's order."""
    version = config.config_version or "NCCL's defaults"
    lines = [
        f"# topo-tune job order for {len(config.node_order)} node(s), {version}: "
        f"{METHODS.get(config.order_method, config.order_method)}"
    ]
    tuned, given = config.order_bottleneck_gbps, config.given_bottleneck_gbps
    if len(config.node_order) < 2:
        pass
    elif not tuned or not given:
        lines.append(
            "# predicted ring bottleneck: unknown (the version carries no pair matrix for these nodes); "
            "the launcher's order is the nodes sorted by name"
        )
    else:
        source = f"{config.measured_edges} of {config.ring_edges} ring edges measured"
        if math.isclose(tuned, given, rel_tol=1e-9):
            lines.append(
                f"# predicted ring bottleneck {tuned:.2f} GB/s, equal to the launcher's order (nodes sorted by "
                f"name) on the pair matrix ({source}): the pair matrix predicts no gain"
            )
        else:
            lines.append(
                f"# predicted ring bottleneck {tuned:.2f} GB/s vs {given:.2f} GB/s in the launcher's order "
                f"(nodes sorted by name): {tuned / given:.2f}x ({source})"
            )
    lines += [f"# warning: {w}" for w in config.warnings]
    return "\n".join(lines) + "\n"


@click.command()
@_nodes_option
@click.option(
    "--flavour",
    type=click.Choice(["mpi", "slurm", "torchrun"]),
    default="mpi",
    show_default=True,
    help="mpi: 'HOST slots=N' for mpirun --hostfile; slurm: one line per task for SLURM_HOSTFILE with srun "
    "--distribution=arbitrary; torchrun: 'HOST NODE_RANK' (pass --node_rank=NODE_RANK on HOST).",
)
@click.option(
    "--version",
    "arm",
    default="",
    metavar="V",
    help="A config version id, 'stable' or 'defaults'. Default: the version the job would get now.",
)
@click.option("--slots", type=click.IntRange(min=1), default=1, show_default=True, help="Ranks per node.")
@click.option("--job-id", default="", help="A job that is pinned already: print its pinned order.")
@connected
def hostfile(
    client: AdminClient,
    fmt: str,
    node_args: tuple[str, ...],
    flavour: str,
    arm: str,
    slots: int,
    job_id: str,
) -> None:
    """Print a hostfile that starts a job on HOSTS in its tuned node order.

    \b
    The order is the one `topo-tune env`/`exec` give the job: the best ring over these nodes on the
    version's pair matrix, never worse there than the launcher's order (the nodes sorted by name). The
    comment gives both predicted ring bottlenecks. Nothing is pinned (unless --job-id names a pinned job,
    whose pin is printed).
    \b
    topo-tune hostfile --nodes gpu[01-08] --slots 8 > hostfile && mpirun --hostfile hostfile -np 64 ...
    topo-tune hostfile --nodes "$SLURM_JOB_NODELIST" --flavour slurm --slots 8 > hosts
    SLURM_HOSTFILE=hosts srun --distribution=arbitrary -n 64 ...
    """
    nodes = _nodes(node_args, os.environ)
    try:
        arm_version(arm, nodes, RolloutView(stable_version=""))
    except ConfigError as error:
        raise click.BadParameter(error.reason, param_hint="--version") from None
    config = client.resolve_job_config(job_id, nodes, arm=arm, preview=True)
    if fmt != "table":
        emit_data({"config_version": config.config_version, "order": _order_data(config)}, fmt)
        return
    body = hostfile_body(cast("HostfileFlavour", flavour), list(config.node_order), slots)
    click.echo(hostfile_comment(config) + body, nl=False)
