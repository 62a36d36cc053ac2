"""``topo-tune agent run`` at its edge: the settings it builds from flags and environment, and what it refuses.

The NCCL versions of the ``--ranks-per-gpu`` tests are the ones seen on the H200 record: torch 2.11's own 2.28.9
(refuses several ranks on one GPU) and 2.30.7 built from source (runs them).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from click.testing import CliRunner

import topo_tune.cli.agent as agent_cli
from topo_tune.agent.settings import AgentSettings
from topo_tune.cli.main import cli

# The module, not the package's ``discover`` function of the same name.
_DISCOVERY = importlib.import_module("topo_tune.agent.discovery.discover")


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


def _agent_run(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "agent",
        "run",
        "--controller",
        "127.0.0.1:1",
        "--state-dir",
        str(tmp_path / "s"),
        "--config-dir",
        str(tmp_path / "c"),
        *extra,
    ]


@pytest.mark.parametrize(
    ("backend", "version", "says"),
    [("gloo", "2.30.7", "needs --backend nccl"), ("nccl", "2.28.9", "that NCCL is 2.28.9")],
)
def test_agent_run_refuses_the_mode_naming_the_flag(
    built: list[AgentSettings],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    version: str,
    says: str,
) -> None:
    monkeypatch.setattr(_DISCOVERY, "libnccl_version", lambda: version)
    argv = _agent_run(tmp_path, "--backend", backend, "--ranks-per-gpu", "2")
    result = CliRunner().invoke(cli, argv, env={"TOPO_TUNE_TOKEN": "t"})
    assert result.exit_code == 2, result.output
    assert "--ranks-per-gpu" in result.output
    assert says in result.output
    assert built == []  # no agent started


def test_agent_run_takes_the_mode_with_nccl_2_30(
    built: list[AgentSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_DISCOVERY, "libnccl_version", lambda: "2.30.7")
    argv = _agent_run(tmp_path, "--backend", "nccl", "--ranks-per-gpu", "4")
    result = CliRunner().invoke(cli, argv, env={"TOPO_TUNE_TOKEN": "t"})
    assert result.exit_code == 0, result.output
    assert built[0].ranks_per_gpu == 4
