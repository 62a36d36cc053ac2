"""``topo-tune hostfile``: a launcher's hostfile for a job's nodes in its tuned order, with the predicted ring
bottleneck next to the launcher's own order's. Nothing is pinned (a pinned job's pin is printed as it is).
"""

from __future__ import annotations

import math
import os
from typing import cast

import click

from topo_tune.cli.admin import connected
from topo_tune.cli.job import job_nodes, nodes_option, order_data
from topo_tune.cli.output import emit_data
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ConfigError
from topo_tune.ids import NO_CONFIG_VERSION
from topo_tune.jobs.config import RolloutView, arm_version
from topo_tune.jobs.job_config import JobConfig
from topo_tune.tuner.ring.job_order import METHODS
from topo_tune.tuner.ring.rank_map import HostfileFlavour, hostfile_body


def hostfile_comment(config: JobConfig) -> str:
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
@nodes_option
@click.option(
    "--flavour",
    type=click.Choice(["mpi", "slurm", "torchrun"]),
    default="mpi",
    show_default=True,
    help="mpi: one line per rank for mpirun --mca rmaps seq --hostfile FILE (the sequential mapper keeps the "
    "order; the default mapper starts on the node mpirun runs on); slurm: one line per task for SLURM_HOSTFILE "
    "with srun --distribution=arbitrary; torchrun: 'HOST NODE_RANK' (pass --node_rank=NODE_RANK on HOST).",
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
    nodes = job_nodes(node_args, os.environ)
    try:
        arm_version(arm, nodes, RolloutView(stable_version=NO_CONFIG_VERSION))
    except ConfigError as error:
        raise click.BadParameter(error.reason, param_hint="--version") from None
    config = client.resolve_job_config(job_id, nodes, arm=arm, preview=True)
    if fmt != "table":
        emit_data({"config_version": config.config_version, "order": order_data(config)}, fmt)
        return
    body = hostfile_body(cast("HostfileFlavour", flavour), list(config.node_order), slots)
    click.echo(hostfile_comment(config) + body, nl=False)
