"""The ``topo-tune`` command: one group, one sub-command per job; errors become one line and exit 1.

The daemons' and ``init``'s modules are imported only when their command runs: they pull in the database
layer, the tuner and SciPy (seconds of start-up on a busy machine), which ``topo-tune admin nodes`` and the
agent never need. Not a plugin system: every command is named here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import click

from topo_tune import __version__
from topo_tune.cli import bench as _bench  # noqa: F401 - registers `admin bench`
from topo_tune.cli import config_admin as _config_admin  # noqa: F401 - registers `admin config`
from topo_tune.cli import credential as _credential  # noqa: F401 - registers `admin credential`
from topo_tune.cli import drift as _drift  # noqa: F401 - registers `admin drift`
from topo_tune.cli import job_comparisons as _job_comparisons  # noqa: F401 - registers `admin job`
from topo_tune.cli import learning as _learning  # noqa: F401 - registers `admin learning`
from topo_tune.cli import logs
from topo_tune.cli import probe as _probe  # noqa: F401 - registers `admin probe`
from topo_tune.cli import study as _study  # noqa: F401 - registers `admin study`
from topo_tune.cli.admin import admin
from topo_tune.cli.output import emit_line
from topo_tune.cli.rollout import rollout
from topo_tune.errors import TopoTuneError

_LAZY_COMMANDS: Mapping[str, str] = {
    "init": "topo_tune.cli.init:init",
    "controller": "topo_tune.cli.controller:controller",
    "agent": "topo_tune.cli.agent:agent",
    "config": "topo_tune.cli.config:config",
    "plugin": "topo_tune.cli.plugin:plugin",
    "topology": "topo_tune.cli.topology:topology",
    "env": "topo_tune.cli.job:env",
    "exec": "topo_tune.cli.job_exec:exec_",
    "hostfile": "topo_tune.cli.hostfile:hostfile",
    "slurm": "topo_tune.cli.slurm:slurm",
    "workload": "topo_tune.cli.workload:workload",
}
"""Top-level command → ``module:attribute`` of its click command, imported on first use."""


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _LAZY_COMMANDS:
            module, attribute = _LAZY_COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command) and command.name == cmd_name, _LAZY_COMMANDS[cmd_name]
            self.add_command(command)
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as error:
            # click suggests among the commands loaded so far; most are loaded on first use (_LAZY_COMMANDS).
            raise click.exceptions.NoSuchCommand(
                error.command_name, possibilities=self.list_commands(ctx), ctx=ctx
            ) from None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TopoTuneError as error:
            emit_line(f"topo-tune: error: {error}", err=True)
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
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="INFO lines (-vv: DEBUG) on stderr, also for init, which otherwise logs them to a file in its output.",
)
@click.pass_context
def cli(ctx: click.Context, log_level: str, log_format: str, verbose: int) -> None:
    """Tune NCCL for this cluster: measure the topology, search configurations and ring orders,
    prove the winner against NCCL's defaults, and roll it out rack by rack.

    \b
    Daemons:    topo-tune controller serve --config cluster.yaml
                topo-tune agent run --controller HOST:PORT
    Operators:  topo-tune admin nodes
                topo-tune admin rollout create VERSION
    Jobs:       topo-tune exec --nodes HOSTS -- CMD ...
    """
    if verbose:
        log_level = "debug" if verbose > 1 else "info"
    chosen = verbose > 0 or ctx.get_parameter_source("log_level") is not click.core.ParameterSource.DEFAULT
    ctx.meta[logs.LEVEL_CHOSEN] = chosen
    logs.configure(level=log_level, fmt=log_format)


cli.add_command(admin)
admin.add_command(rollout)


def main() -> None:
    cli(prog_name="topo-tune")
