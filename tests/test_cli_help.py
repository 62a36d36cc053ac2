"""Every command teaches: --help works everywhere and names the options a user needs."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from topo_tune.cli.main import cli


def all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None, f"{' '.join((*prefix, name))} is listed but does not load"
        if isinstance(command, click.Group):
            found += all_commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


@pytest.mark.parametrize("path", all_commands(cli), ids=lambda p: " ".join(p) or "topo-tune")
def test_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="topo-tune")
    assert result.exit_code == 0, result.output
    assert "Usage: topo-tune" in result.output


def test_daemon_help_names_their_contract() -> None:
    runner = CliRunner()
    serve = runner.invoke(cli, ["controller", "serve", "--help"]).output
    for option in (
        "--config",
        "--listen",
        "--database",
        "--metrics-listen",
        "--health-listen",
        "--token-file",
        "--tls-cert",
        "--tls-client-ca",
    ):
        assert option in serve
    run = runner.invoke(cli, ["agent", "run", "--help"]).output
    for option in ("--controller", "--node-name", "--rack", "--backend", "--state-dir", "--tls-ca"):
        assert option in run
    nodes = runner.invoke(cli, ["admin", "nodes", "--help"]).output
    assert "--output" in nodes and "table|json|yaml" in nodes


def test_bad_arguments_are_usage_errors() -> None:
    result = CliRunner().invoke(cli, ["agent", "run", "--controller", "x:1", "--backend", "mpi"])
    assert result.exit_code == 2
    assert "'mpi' is not one of 'nccl', 'gloo', 'sim'" in result.output
    labels = CliRunner().invoke(cli, ["agent", "run", "--controller", "x:1", "--label", "novalue"])
    assert labels.exit_code == 2 and "expected KEY=VALUE" in labels.output
