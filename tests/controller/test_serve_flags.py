"""``controller serve``: drift and retention settings from cluster.yaml, with the flags over them."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.processes import Daemon, cli_env, free_port, run_cli
from tests.support.waiting import wait_until
from topo_tune.cli import controller as controller_cli
from topo_tune.cli.main import cli
from topo_tune.controller.db.database import Database
from topo_tune.controller.settings import ControllerSettings

ROOT = Path(__file__).resolve().parents[2]


def captured(monkeypatch: pytest.MonkeyPatch) -> list[ControllerSettings]:
    """``controller serve`` runs up to the point where it would start serving: what it would serve with."""
    seen: list[ControllerSettings] = []

    async def capture(settings: ControllerSettings) -> None:
        seen.append(settings)

    monkeypatch.setattr(controller_cli, "_serve", capture)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return seen


def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[int, str, list[ControllerSettings]]:
    seen = captured(monkeypatch)
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "apiVersion: topo-tune/v1\ncontroller:\n"
        "  drift: {interval: 12h, sampleNodes: 3, repeats: 5, threshold: 0.2, alpha: 0.01, openStudy: true}\n"
        "  retention: {maxAge: 30d, batchSize: 50}\n",
        encoding="utf-8",
    )
    token = tmp_path / "token"
    token.write_text("secret", encoding="utf-8")
    result = CliRunner().invoke(
        cli, ["controller", "serve", "--config", str(config), "--token-file", str(token), *flags]
    )
    return result.exit_code, result.output, seen


def test_cluster_yaml_gives_the_settings_and_flags_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, [from_file] = serve(tmp_path, monkeypatch)
    assert code == 0, output
    assert (from_file.drift.interval, from_file.drift.sample_nodes, from_file.drift.threshold) == (43200.0, 3, 0.2)
    assert from_file.drift.open_study
    assert (from_file.drift.repeats, from_file.drift.alpha) == (5, 0.01), "the drop's test as cluster.yaml sets it"
    assert (from_file.retention.max_age, from_file.retention.batch_size) == (30 * 86400.0, 50)

    code, output, [flagged] = serve(
        tmp_path, monkeypatch, "--drift-interval", "0", "--no-drift-open-study", "--retention-max-age", "7d"
    )
    assert code == 0, output
    assert not flagged.drift.enabled and not flagged.drift.open_study, "0 turns the drift check off"
    assert flagged.drift.sample_nodes == 3, "what no flag gives stays as cluster.yaml says"
    assert flagged.retention.enabled and flagged.retention.max_age == 7 * 86400.0

    code, output, [again] = serve(tmp_path, monkeypatch, "--drift-interval", "1h", "--heartbeat-interval", "2s")
    assert code == 0, output
    assert again.drift.enabled and again.drift.interval == 3600.0
    assert (again.heartbeat_interval_s, again.heartbeat_expiry_s) == (2.0, 30.0)


def test_a_bad_duration_is_a_usage_error_naming_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, seen = serve(tmp_path, monkeypatch, "--retention-max-age", "forever")
    assert code == 2 and not seen
    assert "--retention-max-age" in output and "expected a duration such as 10s, 500ms, 2m or 30d" in output


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (("--drift-threshold", "1.5"), "'--drift-threshold': input should be less than 1"),
        (("--drift-sample-nodes", "0"), "'--drift-sample-nodes': input should be greater than or equal to 1"),
        (("--heartbeat-interval", "0s"), "'--heartbeat-interval': input should be greater than 0"),
        (("--listen", "50051"), "'--listen': expected HOST:PORT, e.g. 127.0.0.1:50051, got '50051'"),
    ],
)
def test_a_flag_gets_the_bounds_of_its_cluster_yaml_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], error: str
) -> None:
    code, output, seen = serve(tmp_path, monkeypatch, *flags)
    assert code == 2 and not seen
    assert error in output


def test_flags_are_checked_with_the_file_as_a_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, seen = serve(tmp_path, monkeypatch, "--heartbeat-interval", "45s")
    assert code != 0 and not seen
    assert "controller: heartbeatExpiry must be longer than heartbeatInterval" in output


def test_help_gives_each_flags_key_and_default_from_the_model() -> None:
    text = " ".join(CliRunner().invoke(cli, ["controller", "serve", "--help"]).output.split())
    assert "[cluster.yaml controller.drift.sampleNodes, else 2]" in text
    assert "[cluster.yaml controller.retention.maxAge, else 90d]" in text
    assert "[cluster.yaml controller.heartbeatExpiry, else 30s]" in text


def test_the_token_comes_from_the_flag_then_the_environment_then_cluster_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = captured(monkeypatch)
    config = tmp_path / "cluster.yaml"
    config.write_text(f"apiVersion: topo-tune/v1\ncontroller:\n  tokenFile: {tmp_path / 'absent'}\n", encoding="utf-8")
    flag = tmp_path / "flag.token"
    flag.write_text("from-the-flag", encoding="utf-8")
    serve = ["controller", "serve", "--config", str(config)]

    from_env = CliRunner().invoke(cli, serve, env={"TOPO_TUNE_TOKEN": "from-the-environment"})
    assert from_env.exit_code == 0, from_env.output
    from_flag = CliRunner().invoke(cli, [*serve, "--token-file", str(flag)], env={"TOPO_TUNE_TOKEN": "from-env"})
    assert from_flag.exit_code == 0, from_flag.output
    assert [s.token for s in seen] == ["from-the-environment", "from-the-flag"]

    from_file = CliRunner().invoke(cli, serve, env={"TOPO_TUNE_TOKEN": ""})
    assert from_file.exit_code == 1
    assert f"controller.tokenFile in {config}: cannot read {tmp_path / 'absent'}" in from_file.output
    assert "TOPO_TUNE_TOKEN is unset: set it or pass --token-file" in from_file.output


def test_a_sqlite_database_gets_its_directory(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'var' / 'lib' / 'controller.db'}")
    try:
        database.migrate()
    finally:
        database.engine.dispose()
    assert (tmp_path / "var" / "lib" / "controller.db").is_file(), "made, not retried for a minute"


def test_the_readme_controller_quick_start_with_the_example_cluster_yaml(tmp_path: Path) -> None:
    # README "Using it": export TOPO_TUNE_TOKEN, serve with examples/cluster.yaml (whose tokenFile this machine
    # lacks), issue a node's credential. Only the addresses and the database are this test's own.
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    port = free_port()
    environment = cli_env(TOPO_TUNE_TOKEN=secrets.token_hex(16), TOPO_TUNE_CONTROLLER=f"127.0.0.1:{port}")
    serve = ["controller", "serve", "--config", "examples/cluster.yaml", "--database", "sqlite:///controller.db"]
    serve += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{free_port()}"]
    controller = Daemon(serve, tmp_path / "controller.log", env=environment, cwd=tmp_path).start()
    try:
        issued = wait_until(
            lambda: (
                (r := run_cli("admin", "credential", "issue", "--node", "gpu-a1", env=environment)).returncode == 0
                and r
            ),
            timeout=60,
            what=f"the controller to serve: {controller.output()[-2000:]}",
        )
        assert issued.stdout.startswith("topo-tune-agent:gpu-a1:")
    finally:
        controller.kill()
    assert "cannot read /etc/topo-tune/token" not in controller.output()


def test_agent_config_dir_from_the_flag_over_cluster_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = captured(monkeypatch)
    config = tmp_path / "cluster.yaml"
    config.write_text("apiVersion: topo-tune/v1\nrollout: {agentConfigDir: /srv/topo-tune}\n", encoding="utf-8")
    serve = ["controller", "serve", "--config", str(config)]
    for flags in ([], ["--agent-config-dir", "nodes/config"]):
        result = CliRunner().invoke(cli, [*serve, *flags], env={"TOPO_TUNE_TOKEN": "t"})
        assert result.exit_code == 0, result.output
    assert [s.agent_config_dir for s in seen] == [Path("/srv/topo-tune"), Path.cwd() / "nodes" / "config"]
