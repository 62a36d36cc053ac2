"""``topo-tune agent run`` at its edge: the settings it builds from flags and environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import topo_tune.cli.agent as agent_cli
from topo_tune.agent.settings import AgentSettings
from topo_tune.cli.main import cli


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[AgentSettings]:
    """The settings ``agent run`` would serve with (the daemon itself is not started)."""
    seen: list[AgentSettings] = []

    async def capture(settings: AgentSettings) -> None:
        seen.append(settings)

    monkeypatch.setattr(agent_cli, "_run", capture)
    return seen


def test_relative_state_and_config_dirs_become_absolute(
    built: list[AgentSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Benchmark workers run inside their job's directory: a relative path handed to them pointed nowhere
    # ("s1/bench/<job>/rank-0/config.json" not found).
    monkeypatch.chdir(tmp_path)
    argv = [
        "agent",
        "run",
        "--controller",
        "127.0.0.1:1",
        "--backend",
        "sim",
        "--state-dir",
        "s1",
        "--config-dir",
        "c1",
    ]
    result = CliRunner().invoke(cli, argv, env={"TOPO_TUNE_TOKEN": "t"})
    assert result.exit_code == 0, result.output
    assert built[0].state_dir == tmp_path / "s1"
    assert built[0].config_dir == tmp_path / "c1"


@pytest.mark.parametrize("command", [["agent", "run"], ["admin", "nodes"], ["controller", "serve"], ["env"]])
def test_the_token_is_never_taken_from_argv(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--token", "secret"])
    assert result.exit_code == 2
    assert "No such option '--token'." in result.output
