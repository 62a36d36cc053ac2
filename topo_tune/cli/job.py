"""``topo-tune env``: give a job the one config version its nodes allow and its node order, pinned for its life;
and what ``exec`` and ``hostfile`` share with it (the job's options, its nodes, its resolved config).

Besides the NCCL variables, ``env`` names this node's place in the job's order (``TOPO_TUNE_NODE_RANK``,
``TOPO_TUNE_NNODES``, ``TOPO_TUNE_MASTER_ADDR``, ``TOPO_TUNE_NODE_ORDER``) and prints ``export KEY=VALUE``
lines (``eval "$(topo-tune env ...)"``). It first checks that the version's files are staged on this node (a
rank that silently fell back to NCCL's defaults would disagree with the job's other ranks) and that their
content still hashes to the version's id (a changed file is refused). Running the command is
``topo_tune.cli.job_exec``; printing a launcher's hostfile is ``topo_tune.cli.hostfile``.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from topo_tune.agent.config_store import ConfigStore
from topo_tune.cli.admin import connected
from topo_tune.cli.output import emit_data, emit_line
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ConflictError
from topo_tune.ids import ConfigVersionId
from topo_tune.jobs.config import (
    expand_hostlist,
    job_environment,
    job_id_from_env,
    nodes_from_env,
    order_environment,
)
from topo_tune.jobs.job_config import JobConfig
from topo_tune.versions import node_names
from topo_tune.versions.layout import DEFAULT_CONFIG_DIR


def nodes_option(function: Any) -> Any:
    """``--nodes``: the job's nodes (``hostfile`` takes only this one)."""
    return click.option(
        "--nodes",
        "node_args",
        multiple=True,
        metavar="HOSTS",
        help="The job's nodes: repeat, comma-separate or Slurm ranges (gpu[01-04]). "
        "Default: $TOPO_TUNE_NODES, then $SLURM_JOB_NODELIST; with a Kubernetes Job's or JobSet's uid as the job "
        "id, a controller in Kubernetes mode reads them from the API. Their order does not matter.",
    )(function)


def job_options(function: Any) -> Any:
    """The options ``env`` and ``exec`` share: the job's nodes, this node, the job id, where versions are staged."""
    function = nodes_option(function)
    function = click.option(
        "--node",
        "node",
        default="",
        metavar="NAME",
        help="The node this runs on, as the agent names it. Default: $TOPO_TUNE_NODE_NAME, then $SLURMD_NODENAME, "
        "then the name this host's agent recorded for this host name (CONFIG_DIR/node-name), then the host name.",
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


_KUBERNETES_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A Kubernetes object's ``metadata.uid``: a job id of this form may leave its nodes to the controller."""


def job_nodes(node_args: tuple[str, ...], environ: Mapping[str, str], *, job_id: str = "") -> list[str]:
    """The job's nodes from ``--nodes``, else from the launcher's environment; none is a usage error, except for
    a job id that is a Kubernetes uid (a Job's or JobSet's): [] asks the controller to read them from the API."""
    nodes = [host for arg in node_args for host in expand_hostlist(arg, source="--nodes")]
    if not nodes:
        nodes = nodes_from_env(environ)
    if not nodes and not _KUBERNETES_UID.fullmatch(job_id):
        raise click.UsageError(
            "no nodes: pass --nodes HOSTS (torchrun and mpirun do not export a node list; on Kubernetes, a job id "
            "that is its Job's or JobSet's uid lets the controller find them)"
        )
    return nodes


NODE_NAME_VARIABLES = ("TOPO_TUNE_NODE_NAME", "SLURMD_NODENAME")
"""Who names the node a rank runs on, first match wins: the user, then Slurm (slurmd sets its node's name in
every task; a TaskProlog and the task-prolog command need the Slurm name to be the agent's). Open MPI and
torchrun export no name of their own for the node: Open MPI's ``PMIX_HOSTNAME`` is the host name, and
torchrun's ``GROUP_RANK`` is the rank ``exec`` gave it, not a name."""


def this_node(option: str, environ: Mapping[str, str], config_dir: Path) -> str:
    """The node this runs on: ``--node``, ``$TOPO_TUNE_NODE_NAME``, ``$SLURMD_NODENAME``, the name this host's
    agent recorded (read from this host's line only: a shared config directory never names another host; two
    names for this host are refused), the host name."""
    if option:
        return option
    for name in NODE_NAME_VARIABLES:
        if environ.get(name):
            return environ[name]
    host = socket.gethostname()
    return node_names.recorded_name(config_dir, host) or host


def resolve_job(
    client: AdminClient,
    *,
    node_args: tuple[str, ...],
    job_id: str,
    config_dir: Path,
    tuner_plugin: Path | None,
    node: str | None,
    arm: str = "",
    may_learn: bool = False,
) -> tuple[JobConfig, dict[str, str]]:
    """The job's config and its variables; ``node`` None: no TOPO_TUNE_NODE_RANK (a launcher starts the others);
    ``may_learn``: the caller ships the job's timing records, so a new pin may draw a learning arm."""
    environ = os.environ
    job_id = job_id or job_id_from_env(environ)
    if not job_id:
        raise click.UsageError("no job id: pass --job-id or run under Slurm, torchrun or MPI")
    config = client.resolve_job_config(
        job_id, job_nodes(node_args, environ, job_id=job_id), arm=arm, may_learn=may_learn
    )
    warn(config)
    if "nccl_tuner.conf" in config.files and tuner_plugin is None:
        emit_line("topo-tune: warning: the version has a tuner table but no --tuner-plugin was given", err=True)
    if tuner_plugin is not None:
        tuner_plugin = tuner_plugin.absolute()
    return config, job_variables(config, job_id=job_id, config_dir=config_dir, tuner_plugin=tuner_plugin, node=node)


def job_variables(
    config: JobConfig, *, job_id: str, config_dir: Path, tuner_plugin: Path | None, node: str | None
) -> dict[str, str]:
    """The variables a rank of the job gets: the version's NCCL files, then its place in the job's node order."""
    variables = job_environment(
        config.config_version,
        config_dir=config_dir.absolute(),
        files=config.files,
        tuner_plugin=tuner_plugin,
        job_id=job_id,
        learning=config.learning,
    )
    variables.update(order_environment(config.node_order, node=node, master_addr=config.master_addr))
    return variables


def warn(config: JobConfig) -> None:
    """The controller's warnings about the job's config, one line each on stderr."""
    for warning in config.warnings:
        emit_line(f"topo-tune: warning: {warning}", err=True)


def _check_content(config_dir: Path, version: ConfigVersionId) -> None:
    """Refuse to hand out a staged version whose files no longer hash to its id (changed after staging)."""
    if not version:
        return
    try:
        ConfigStore(config_dir).read(version)
    except ConflictError as error:
        raise click.ClickException(
            f"{error}; not handing it to a job (the agent reports it and the controller re-applies it)"
        ) from None


def check_staged(config: JobConfig, conf: str, config_dir: Path) -> None:
    """Refuse a version that is not staged (or changed) in this node's ``config_dir``: NCCL would silently run on
    its defaults here while the job's other ranks use the version (a hang, or numbers that disagree)."""
    if not os.path.exists(conf):
        raise click.ClickException(
            f"{config.config_version} is not staged on this node ({conf} is missing; is --config-dir the agent's "
            f"--config-dir?); not handing a rank an NCCL config that would differ from the others'"
        )
    _check_content(config_dir, config.config_version)


def check_unchanged(config: JobConfig, conf: str, config_dir: Path) -> None:
    """On a host that starts the job's ranks elsewhere (``exec --launcher slurm|mpi``): the version need not be
    staged here, but if it is, its files must still hash to its id."""
    if os.path.exists(conf):
        _check_content(config_dir, config.config_version)


def order_data(config: JobConfig) -> dict[str, object]:
    """The job's node order as ``--format json``/``yaml`` prints it."""
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


def _prediction(value: float | None) -> float | None:
    return value if value and math.isfinite(value) else None


@click.command()
@job_options
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
    torchrun:   eval "$(topo-tune env --job-id "$RUN" --nodes "$NODES")"     (one RUN per run of the job)
                torchrun --node_rank=$TOPO_TUNE_NODE_RANK --nnodes=$TOPO_TUNE_NNODES \\
                         --master_addr=$TOPO_TUNE_MASTER_ADDR --nproc_per_node=8 train.py
    Kubernetes: the pod asks for its rank (JOB_COMPLETION_INDEX is not the rank); with its Job's or
                JobSet's uid as --job-id it needs no --nodes (the controller reads the pods;
                docs/kubernetes.md has an init container that does it for an image without topo-tune).
    """
    here = this_node(node, os.environ, config_dir)
    config, variables = resolve_job(
        client, node_args=node_args, job_id=job_id, config_dir=config_dir, tuner_plugin=tuner_plugin, node=here
    )
    check_staged(config, variables["NCCL_CONF_FILE"], config_dir)
    if fmt != "table":
        emit_data(
            {
                "job_id": config.job_id,
                "config_version": config.config_version,
                "env": variables,
                "order": order_data(config),
            },
            fmt,
        )
        return
    for key, value in variables.items():
        click.echo(f"export {key}={shlex.quote(value)}")
