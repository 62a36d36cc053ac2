"""End to end with real processes: a controller and three agents on loopback, driven through the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from tests.support.liveness import assert_lost_after_the_expiry
from tests.support.processes import LocalCluster, cli_env, free_port, run_cli
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

AGENTS = ("node-1", "node-2", "node-3")


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[LocalCluster]:
    local = LocalCluster(workdir=tmp_path, database_url=database_url)
    try:
        yield local
    finally:
        local.stop()
        logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in tmp_path.glob("*.log"))
        print(logs)


def nodes_json(cluster: LocalCluster) -> dict[str, dict[str, object]]:
    result = cluster.admin("nodes", "--output", "json")
    assert result.returncode == 0, result.stderr
    return {node["name"]: node for node in json.loads(result.stdout)}


def states(cluster: LocalCluster) -> dict[str, str]:
    return {name: str(node["state"]) for name, node in nodes_json(cluster).items()}


def commands_json(cluster: LocalCluster) -> dict[str, dict[str, object]]:
    result = cluster.admin("commands", "--output", "json")
    assert result.returncode == 0, result.stderr
    return {c["command_id"]: c for c in json.loads(result.stdout)}


def all_ready(cluster: LocalCluster) -> bool:
    return states(cluster) == dict.fromkeys(AGENTS, "ready")


def test_lost_agents_and_a_controller_restart(cluster: LocalCluster) -> None:
    cluster.start_controller()
    for name in AGENTS:
        cluster.start_agent(name, rack="rack-a" if name != "node-3" else "rack-b")
    wait_until(lambda: all_ready(cluster), what="three ready nodes")
    assert_plain_scripting_output(cluster)

    for name in AGENTS:
        sent = cluster.admin("rediscover", name, "--id", f"before-{name}", "-o", "json")
        assert sent.returncode == 0, sent.stderr
    wait_until(
        lambda: all(c["status"] == "succeeded" for c in commands_json(cluster).values()),
        what="three rediscoveries",
    )

    # SIGKILL one agent: the node is lost once silent for the configured expiry, not before and not much later.
    cluster.agents["node-2"].kill()
    wait_until(lambda: states(cluster)["node-2"] == "lost", what="node-2 lost", timeout=15)
    assert cluster.controller is not None
    assert_lost_after_the_expiry(
        cluster.controller, lambda: nodes_json(cluster), "node-2", expiry_s=cluster.heartbeat_expiry
    )
    assert states(cluster)["node-1"] == "ready"

    # A command for the dead node waits; one for a live node runs.
    assert cluster.admin("rediscover", "node-2", "--id", "while-lost").returncode == 0

    # Restart the controller (SIGKILL, then a new process on the same port and database).
    assert cluster.controller is not None
    cluster.controller.kill()
    cluster.start_controller()
    seen: list[object] = []

    def live_agents_registered_again() -> bool:
        live = [
            (n["name"], n["state"], n["registrations"]) for n in nodes_json(cluster).values() if n["name"] != "node-2"
        ]
        seen[:] = [live]
        return live == [("node-1", "ready", 2), ("node-3", "ready", 2)]

    try:
        wait_until(live_agents_registered_again, what="the live agents to re-register by themselves")
    except AssertionError as error:
        raise AssertionError(f"{error}; the live nodes last read {seen}") from None
    nodes = nodes_json(cluster)
    assert sorted(nodes) == list(AGENTS), "no node lost or duplicated"
    assert nodes["node-1"]["registrations"] == 2
    assert nodes["node-3"]["rack"] == "rack-b"
    commands_json_after_restart = commands_json(cluster)
    assert sorted(commands_json_after_restart) == sorted([*(f"before-{n}" for n in AGENTS), "while-lost"])
    for name in AGENTS:
        before = commands_json_after_restart[f"before-{name}"]
        assert (before["status"], before["deliveries"]) == ("succeeded", 1)
    assert commands_json_after_restart["while-lost"]["status"] == "pending"

    # The killed agent comes back: it re-registers and runs its waiting command, once.
    cluster.start_agent("node-2", rack="rack-a")
    wait_until(lambda: all_ready(cluster), what="node-2 back")
    wait_until(
        lambda: commands_json(cluster)["while-lost"]["status"] == "succeeded",
        what="the waiting command",
    )
    final = commands_json(cluster)
    assert final["while-lost"]["deliveries"] == 1
    assert len(final) == 4
    assert cluster.agents["node-2"].output().count("executing command while-lost") == 1


def assert_plain_scripting_output(cluster: LocalCluster) -> None:
    """-o json and -o yaml print plain values a script filters on: jq '.[] | select(.state=="ready")'."""
    as_json = json.loads(cluster.admin("nodes", "-o", "json").stdout)
    as_yaml = yaml.safe_load(cluster.admin("nodes", "-o", "yaml").stdout)
    for listed in (as_json, as_yaml):
        ready = [n for n in listed if n["state"] == "ready"]
        assert sorted(n["name"] for n in ready) == list(AGENTS)
        node = ready[0]
        assert node["backend"] == "sim" and node["activity"] in ("idle", "busy")
        assert node["registrations"] == 1
        stamp = datetime.fromisoformat(node["last_heartbeat_at"])
        assert stamp.tzinfo is not None and node["last_heartbeat_at"].endswith("Z")
    if shutil.which("jq"):  # the README's example, with the real tool where the machine has it
        picked = subprocess.run(
            ["jq", "-r", '.[] | select(.state=="ready") | .name'],
            input=json.dumps(as_json),
            capture_output=True,
            text=True,
            check=True,
        )
        assert sorted(picked.stdout.split()) == list(AGENTS)


def _stored_fanout(database_url: str, prefix: str) -> int:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            query = sa.text("SELECT count(*) FROM commands WHERE id LIKE :p")
            return int(connection.execute(query, {"p": f"{prefix}-%"}).scalar_one())
    except sa.exc.OperationalError:  # the schema is not there yet
        return 0
    finally:
        engine.dispose()


def test_a_fan_out_survives_a_controller_killed_mid_way_without_losing_or_doubling_a_command(
    cluster: LocalCluster, database_url: str
) -> None:
    fleet = [f"fan-{i}" for i in range(8)]
    cluster.start_controller()
    for name in fleet:
        cluster.start_agent(name)
    wait_until(lambda: set(states(cluster).values()) == {"ready"} and len(states(cluster)) == 8, what="8 ready")

    # The fan-out goes out from its own CLI process; the controller is SIGKILLed as soon as the commands are
    # stored, while they are being sent, acknowledged and answered.
    sender = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "topo_tune",
            "admin",
            "rediscover",
            "--all",
            "--id",
            "op-7",
            "--controller",
            cluster.address,
        ],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: _stored_fanout(database_url, "op-7") > 0, what="the fan-out stored", interval=0.005)
    assert cluster.controller is not None
    cluster.controller.kill()
    sender.communicate(timeout=30)
    assert _stored_fanout(database_url, "op-7") == 8, "stored in one transaction: all or none"

    # A new controller; the operator retries the same fan-out (same id): nothing is stored twice.
    cluster.start_controller()
    wait_until(lambda: len(states(cluster)) == 8 and all_ready_of(cluster, fleet), what="the agents back")
    again = cluster.admin("rediscover", "--all", "--id", "op-7", "-o", "json")
    assert again.returncode == 0, again.stderr
    assert sorted(c["command_id"] for c in json.loads(again.stdout)) == sorted(f"op-7-{n}" for n in fleet)
    wait_until(
        lambda: [c["status"] for c in commands_json(cluster).values()] == ["succeeded"] * 8,
        what="every node's command succeeded",
    )
    assert sorted(commands_json(cluster)) == sorted(f"op-7-{n}" for n in fleet), "none lost, none doubled"
    for name in fleet:
        assert cluster.agents[name].output().count(f"executing command op-7-{name}") == 1, name


def all_ready_of(cluster: LocalCluster, names: list[str]) -> bool:
    found = states(cluster)
    return all(found.get(n) == "ready" for n in names)


def test_sigterm_stops_the_controller_cleanly(cluster: LocalCluster) -> None:
    controller = cluster.start_controller()
    cluster.start_agent("node-1")
    wait_until(lambda: states(cluster) == {"node-1": "ready"}, what="node-1 ready")
    assert controller.terminate(timeout=20) == 0
    assert "controller stopped" in controller.output()
    # The agent keeps running and comes back by itself when a controller returns.
    assert cluster.agents["node-1"].alive()
    cluster.start_controller()
    wait_until(lambda: nodes_json(cluster)["node-1"]["registrations"] == 2, what="re-registration")


def test_cli_errors_are_one_clear_line() -> None:
    unreachable = run_cli("admin", "nodes", "--controller", f"127.0.0.1:{free_port()}")
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith("topo-tune: error: controller 127.0.0.1:")
    assert "is unreachable" in unreachable.stderr
    assert unreachable.stderr.count("\n") == 1

    no_token = run_cli("admin", "nodes", env={k: v for k, v in cli_env().items() if k != "TOPO_TUNE_TOKEN"})
    assert no_token.returncode == 1
    assert "no token: pass --token-file FILE or set TOPO_TUNE_TOKEN" in no_token.stderr

    bad_yaml = run_cli("config", "validate", "/nonexistent.yaml")
    assert bad_yaml.returncode == 1
    assert bad_yaml.stderr.strip() == "topo-tune: error: cannot read /nonexistent.yaml: No such file or directory"


def test_wrong_token_is_reported_by_the_cli(cluster: LocalCluster) -> None:
    cluster.start_controller()
    refused = run_cli("admin", "nodes", "--controller", cluster.address, env=cli_env(TOPO_TUNE_TOKEN="not-the-token"))
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"topo-tune: error: controller {cluster.address} refused the token: missing or invalid bearer token"
    )
