"""The daemons' Kubernetes flags at the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from topo_tune.cli.main import cli


@pytest.mark.parametrize("how", [["--leader-election"], []])
def test_leader_election_outside_a_pod_is_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: list[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("TOPO_TUNE_LEADER_ELECTION", "true")  # as the chart sets it; the flag does the same
    token = tmp_path / "token"
    token.write_text("secret", encoding="utf-8")
    args = ["controller", "serve", "--token-file", str(token), "--database", f"sqlite:///{tmp_path / 'db'}", *how]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert "topo-tune: error: --leader-election: needs the Kubernetes API: run the controller in a pod" in result.output


def test_the_agent_documents_the_rack_label() -> None:
    result = CliRunner().invoke(cli, ["agent", "run", "--help"])
    assert "--rack-label" in result.output
    assert "TOPO_TUNE_RACK_LABEL" in result.output
    assert "topology.kubernetes.io/rack" in result.output
