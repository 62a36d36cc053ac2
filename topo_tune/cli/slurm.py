"""``topo-tune slurm``: Slurm's side of a job without a wrapper: ``task-prolog`` for ``TaskProlog=`` in slurm.conf.

The prolog resolves the job exactly as ``topo-tune env`` does (``topo_tune.cli.job``), from Slurm's variables,
and prints ``export`` lines for slurmstepd (``topo_tune.jobs.task_prolog``). It never breaks a job: whatever
fails, it prints nothing, logs why and exits 0, and the job runs on NCCL's defaults.

Non-goals: changing ``SLURM_PROCID`` (no prolog can: ``exec --launcher slurm`` sets ``SLURM_HOSTFILE``) and
Slurm's own Prolog/Epilog (run as root by slurmd, not in the task's environment).
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import click

from topo_tune.cli.connection import (
    client_tls,
    client_tls_options,
    controller_option,
    resolve_token,
    token_options,
)
from topo_tune.cli.job import check_staged, resolve_job
from topo_tune.cli.output import emit_line, shown
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ConfigError
from topo_tune.jobs.config import expand_hostlist, slurm_job_id
from topo_tune.jobs.task_prolog import PrologAnswer, PrologCache, prolog_lines
from topo_tune.versions.layout import DEFAULT_CONFIG_DIR

SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURMD_NODENAME")
"""What the prolog reads from the task's environment (slurmstepd sets all three)."""


def default_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"topo-tune-task-prolog-{os.getuid()}"


@click.group()
def slurm() -> None:
    """Slurm integration: run from slurm.conf, not by users (docs/slurm.md)."""


@slurm.command("task-prolog")
@controller_option
@token_options
@client_tls_options
@click.option(
    "--config-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_CONFIG_DIR,
    show_default=True,
    help="Where this node's agent stages config versions (its --config-dir).",
)
@click.option(
    "--tuner-plugin",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The tuner plugin library; exported when the job's version has a tuner table.",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where the node keeps each job's answer (a directory of the job's user, mode 0700). "
    "Default: topo-tune-task-prolog-UID in the temporary directory.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0.1, 60),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the controller before the job starts on NCCL's defaults.",
)
@click.option(
    "--log-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Append why a job got no settings here (slurmstepd discards a TaskProlog's stderr). Default: stderr.",
)
def task_prolog(
    address: str,
    token_file: Path | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    config_dir: Path,
    tuner_plugin: Path | None,
    cache_dir: Path | None,
    timeout_s: float,
    log_file: Path | None,
) -> None:
    """Print the task's pinned NCCL settings and node order as `export NAME=value` lines for slurmstepd.

    \b
    slurm.conf on every node:   TaskProlog=/etc/slurm/topo-tune-task-prolog
    that file (executable):     #!/bin/sh
                                topo-tune slurm task-prolog --controller HOST:PORT \\
                                  --token-file /etc/topo-tune/job.token --log-file /var/log/topo-tune-prolog.log || true
    (|| true: Slurm fails the job when a TaskProlog exits non-zero, also when topo-tune cannot start.)
    From SLURM_JOB_ID, SLURM_JOB_NODELIST and SLURMD_NODENAME (the node's Slurm name must be its agent's name),
    every task gets what `topo-tune env` prints: NCCL_CONF_FILE (the version the job is pinned to),
    TOPO_TUNE_NODE_RANK, TOPO_TUNE_NNODES, TOPO_TUNE_MASTER_ADDR and TOPO_TUNE_NODE_ORDER; so a job script
    with no topo-tune in it runs on the tuned config, and torchrun takes --node_rank=$TOPO_TUNE_NODE_RANK.
    One controller round trip per job and node (the node's other tasks read the cached answer). On any
    failure it prints nothing, logs why, exits 0, and the job runs on NCCL's defaults.
    It cannot change SLURM_PROCID: srun's ranks follow the order only under `exec --launcher slurm`.
    """
    try:
        answer = _answer(
            address=address,
            token_file=token_file,
            tls=(tls_ca, tls_cert, tls_key),
            config_dir=config_dir,
            tuner_plugin=tuner_plugin,
            cache_dir=cache_dir or default_cache_dir(),
            timeout_s=timeout_s,
        )
    except OSError as error:  # the cache's lock or file: nothing half-printed, the job still starts
        answer = PrologAnswer(reason=f"{error}; the job runs on NCCL's defaults")
    if answer.reason:
        _log(log_file, answer.reason)
    for line in answer.lines:
        click.echo(line)


def _answer(
    *,
    address: str,
    token_file: Path | None,
    tls: tuple[Path | None, Path | None, Path | None],
    config_dir: Path,
    tuner_plugin: Path | None,
    cache_dir: Path,
    timeout_s: float,
) -> PrologAnswer:
    missing = [name for name in SLURM_VARIABLES if not os.environ.get(name)]
    if missing:
        return PrologAnswer(reason=f"{', '.join(missing)} not set: not a Slurm task; no settings")
    job_id, node = slurm_job_id(os.environ), os.environ["SLURMD_NODENAME"]
    try:
        nodes = expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
    except ConfigError as error:
        return PrologAnswer(reason=f"job {job_id}: {error}; the job runs on NCCL's defaults")

    def ask() -> PrologAnswer:
        try:
            with AdminClient(
                address, token=resolve_token(token_file), tls=client_tls(*tls), timeout_s=timeout_s
            ) as client:
                config, variables = resolve_job(
                    client,
                    node_args=(",".join(nodes),),
                    job_id=job_id,
                    config_dir=config_dir,
                    tuner_plugin=tuner_plugin,
                    node=node,
                )
                check_staged(config, variables["NCCL_CONF_FILE"], config_dir)
            return PrologAnswer(tuple(prolog_lines(variables)))
        except click.ClickException as error:
            return PrologAnswer(reason=f"job {job_id} on {node}: {error.format_message()}; NCCL's defaults")
        except Exception as error:  # a prolog that raises would fail the user's task: any error is logged
            return PrologAnswer(reason=f"job {job_id} on {node}: {error}; the job runs on NCCL's defaults")

    cache = PrologCache(cache_dir)
    try:
        cache.check()
    except OSError as error:
        answer = ask()
        return PrologAnswer(answer.lines, f"{answer.reason}; cache not used: {error}".lstrip("; "))
    with cache.locked(cache.key(job_id, node, nodes)) as path:
        cached = cache.read(path)
        if cached is not None:
            return cached
        answer = ask()
        cache.write(path, answer)
        return answer


def _log(log_file: Path | None, reason: str) -> None:
    # The reason may quote a controller's answer: one line, escaped, in the file as on the terminal.
    line = f"{datetime.now(UTC).isoformat(timespec='seconds')} topo-tune slurm task-prolog: {shown(reason)}"
    if log_file is not None:
        try:
            with log_file.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
            return
        except OSError:
            pass
    emit_line(line, err=True)
