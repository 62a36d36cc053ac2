"""The ``topo-tune`` command: one group, one sub-command per job; errors become one line and exit 1."""

from __future__ import annotations

import click

from topo_tune import __version__
from topo_tune.cli import bench as _bench  # noqa: F401 - registers `admin bench`
from topo_tune.cli import config_admin as _config_admin  # noqa: F401 - registers `admin config`
from topo_tune.cli import drift as _drift  # noqa: F401 - registers `admin drift`
from topo_tune.cli import logs
from topo_tune.cli import probe as _probe  # noqa: F401 - registers `admin probe`
from topo_tune.cli import study as _study  # noqa: F401 - registers `admin study`
from topo_tune.cli.admin import admin
from topo_tune.cli.agent import agent
from topo_tune.cli.config import config
from topo_tune.cli.controller import controller
from topo_tune.cli.init import init
from topo_tune.cli.job import env, exec_
from topo_tune.cli.plugin import plugin
from topo_tune.cli.rollout import rollout
from topo_tune.cli.topology import topology
from topo_tune.errors import TopoTuneError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TopoTuneError as error:
            click.echo(f"topo-tune: error: {error}", err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="topo-tune")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    envvar="TOPO_TUNE_LOG_LEVEL",
)
@click.option(
    "--log-format",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    envvar="TOPO_TUNE_LOG_FORMAT",
    help="json: one JSON object per line, for log collectors.",
)
def cli(log_level: str, log_format: str) -> None:
    """Tune NCCL for this cluster: measure the topology, search configurations and ring orders,
    prove the winner against NCCL's defaults, and roll it out rack by rack.

    \b
    Daemons:    topo-tune controller serve --config cluster.yaml
                topo-tune agent run --controller HOST:PORT
    Operators:  topo-tune admin nodes
                topo-tune admin rollout create VERSION
    Jobs:       topo-tune exec --nodes HOSTS -- CMD ...
    """
    logs.configure(level=log_level, fmt=log_format)


cli.add_command(init)
cli.add_command(controller)
cli.add_command(agent)
cli.add_command(admin)
cli.add_command(config)
cli.add_command(plugin)
cli.add_command(topology)
cli.add_command(env)
cli.add_command(exec_)
admin.add_command(rollout)


def main() -> None:
    cli(prog_name="topo-tune")
