"""``topo-tune env`` / ``topo-tune exec``: give a job the one config version its nodes allow, pinned for its life.

``env`` prints ``export KEY=VALUE`` lines (``eval "$(topo-tune env ...)"``); ``exec`` runs the command with
them. Both first check that the version's files are staged on this node (a rank that silently fell back to
NCCL's defaults would disagree with the job's other ranks) and that their content still hashes to the version's
id (a changed file is refused). ``exec`` replaces
itself with the command while holding a shared lock on this node's ``jobs.lock`` (inherited by the command and
its children), so the agent never changes this node's config under the job.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from topo_tune.agent.config_store import ConfigStore, jobs_lock_shared
from topo_tune.cli.admin import connected
from topo_tune.cli.compare import ArmConfig, compare_options, run_comparison, spec_from_options
from topo_tune.cli.output import emit_data
from topo_tune.client import AdminClient
from topo_tune.config_layout import DEFAULT_CONFIG_DIR
from topo_tune.config_version import is_version_id
from topo_tune.errors import ConfigError, ConflictError
from topo_tune.job_config import expand_hostlist, job_environment, job_id_from_env, nodes_from_env
from topo_tune.plugin.job_env import workload_env
from topo_tune.v1 import admin_pb2


def _job_options(function: Any) -> Any:
    function = click.option(
        "--nodes",
        "node_args",
        multiple=True,
        metavar="HOSTS",
        help="The job's nodes: repeat, comma-separate or Slurm ranges (gpu[01-04]). "
        "Default: $TOPO_TUNE_NODES, then $SLURM_JOB_NODELIST.",
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


def _resolve(
    client: AdminClient,
    *,
    node_args: tuple[str, ...],
    job_id: str,
    config_dir: Path,
    tuner_plugin: Path | None,
) -> tuple[admin_pb2.JobConfig, dict[str, str]]:
    environ = os.environ
    job_id = job_id or job_id_from_env(environ)
    if not job_id:
        raise click.UsageError("no job id: pass --job-id or run under Slurm, torchrun or MPI")
    config = client.resolve_job_config(job_id, _nodes(node_args, environ))
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
    return config, env


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
    job_id: str,
    config_dir: Path,
    tuner_plugin: Path | None,
) -> None:
    """Print the environment of a job on these nodes: eval "$(topo-tune env --nodes ...)".

    \b
    Every rank of the job gets the same config version: the rollout's new one only if all the job's
    nodes are in completed waves, otherwise the previous stable one; the answer is pinned to the job id.
    """
    config, variables = _resolve(
        client, node_args=node_args, job_id=job_id, config_dir=config_dir, tuner_plugin=tuner_plugin
    )
    _check_staged(config, variables["NCCL_CONF_FILE"], config_dir)
    if fmt != "table":
        emit_data({"job_id": config.job_id, "config_version": config.config_version, "env": variables}, fmt)
        return
    for key, value in variables.items():
        click.echo(f"export {key}={shlex.quote(value)}")


def _staged_arm(name: str, *, job_id: str, nodes: list[str], config_dir: Path, tuner_plugin: Path | None) -> ArmConfig:
    """An arm of ``exec --compare`` from this node's staged versions, in the order of the nodes sorted by name."""
    if name == "defaults":
        version, files = "", []
    elif is_version_id(name):
        version, files = name, sorted(ConfigStore(config_dir).read(name))
    else:
        raise ConfigError("--compare", f"{name!r}: give a staged config version id, or defaults for --against")
    order = sorted(set(nodes))
    variables = job_environment(
        version, config_dir=config_dir.absolute(), files=files, tuner_plugin=tuner_plugin, job_id=job_id
    )
    variables.update({"TOPO_TUNE_NNODES": str(len(order)), "TOPO_TUNE_NODE_ORDER": ",".join(order)})
    return ArmConfig(name=name, version=version, order=tuple(order), variables=variables)


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@_job_options
@compare_options
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
    command: tuple[str, ...],
) -> None:
    """Run COMMAND with the job's pinned config: topo-tune exec [--nodes ...] -- CMD ARGS...

    \b
    torchrun:  topo-tune exec --nodes "$NODES" -- torchrun --nnodes 4 ... train.py
    Slurm:     srun topo-tune exec -- python train.py     (nodes and job id from Slurm)
    Kubernetes: set TOPO_TUNE_JOB_ID from the Job's uid (downward API) and TOPO_TUNE_NODES.

    \b
    The job's own A/B, started on every node like plain exec (COMMAND runs 2 x PAIRS times, the arms
    interleaved in an order every node derives from the job id):
      topo-tune exec --compare stable --against defaults --pairs 5 --metric 'step_time=([0-9.]+)' \\
          -- torchrun ... train.py
    Each run gets its arm's NCCL files and node order; node rank 0 of each run reads the metric (the
    last match, group 1; lower is better unless --higher-is-better); the figures (median per arm, gain,
    CI, the tuner's proof statistics) are printed and recorded: topo-tune admin job comparisons.
    """
    if record_workload is not None and tuner_plugin is None:
        raise click.UsageError("--record-workload needs --tuner-plugin: the plugin counts the calls")
    if record_workload is not None and (candidate or against):
        raise click.UsageError("--record-workload records a plain exec run, not a --compare")
    if candidate or against or metric or higher_is_better:
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
            node=os.environ.get("TOPO_TUNE_NODE_NAME") or socket.gethostname(),
            resolve=lambda name: _staged_arm(name, job_id=job, nodes=nodes, config_dir=config_dir, tuner_plugin=plugin),
            command=command,
            environ=os.environ,
        )
        sys.exit(status)
    config, variables = _resolve(
        client, node_args=node_args, job_id=job_id, config_dir=config_dir, tuner_plugin=tuner_plugin
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
    sys.stdout.flush()
    try:
        os.execvpe(command[0], list(command), {**os.environ, **variables})
    except OSError as error:
        raise click.ClickException(f"cannot run {command[0]!r}: {error.strerror}") from None
