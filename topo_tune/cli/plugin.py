"""``topo-tune plugin``: build topo-tune's NCCL tuner plugin on this machine.

Non-goals: installing the library system-wide or editing a job's environment (``topo-tune exec``/``env`` do
that with :func:`topo_tune.plugin.plugin_env`).
"""

from __future__ import annotations

from pathlib import Path

import click

from topo_tune.cli.output import emit_line, emit_lines
from topo_tune.plugin import PLUGIN_ENV, TABLE_ENV, build_plugin

__all__ = ["plugin"]


@click.group()
def plugin() -> None:
    """topo-tune's NCCL tuner plugin (libnccl-tuner-topotune.so)."""


@plugin.command()
@click.option(
    "--output",
    "output",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(),
    show_default="the current directory",
    help="Directory to write libnccl-tuner-topotune.so into (created if missing).",
)
def build(output: Path) -> None:
    """Compile the plugin with the system C compiler ($CC, else cc, gcc or clang)."""
    built = build_plugin(output)  # a PluginBuildError becomes "topo-tune: error: ..." and exit status 1
    if built.diagnostics:
        emit_lines(built.diagnostics, err=True)
    emit_line(f"built {built.path}")
    emit_line(f"load it with {PLUGIN_ENV}={built.path} and {TABLE_ENV}=<absolute path of the table>")
