"""`topo-tune init` decides which nodes are this machine: it runs their agents itself, and tells how the others join.

CI has no GPU, so `gloo` stands in for `nccl` here: the decision (`local_cluster.nodes_here`), the embedded
controller and the in-process agent are the code an `nccl` one-box run goes through; only the agent's backend
differs. On a machine without GPUs the one-box example goes down the `nccl` path itself as far as it can: its
agent starts here, registers, and the pass stops on the GPUs it did not find. The other `nccl` rules of the
decision (the node named by this host, an address of this machine) are in `tests/test_nodes_here.py`.
"""

from __future__ import annotations

import json
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.processes import cli_env, run_cli
from tests.support.waiting import wait_until
from topo_tune.agent.discovery import discover

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

# The smallest pass: NCCL's defaults measured once, on one size, then every output written.
SEARCH = {
    "budget": 1,
    "minBytes": "4K",
    "maxBytes": "4K",
    "stepFactor": 2,
    "rungs": 1,
    "finalists": 0,
    "iters": 2,
    "warmupIters": 1,
    "jobDeadline": "60s",
    "tunerTable": False,
}


def cluster_file(tmp_path: Path, nodes: list[dict[str, Any]], **extra: Any) -> Path:
    config = {
        "apiVersion": "topo-tune/v1",
        "metadata": {"name": "here"},
        "backend": "gloo",
        "racks": [{"name": "rack-a", "nodes": nodes}],
        "workload": {"collectives": {"all_reduce": 1}},
        "search": SEARCH,
        **extra,
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_node_that_is_this_machine_gets_its_agent_from_init_and_no_other_process(tmp_path: Path) -> None:
    # The node's address is this host's name: init must see that it is this machine and run its agent itself.
    config = cluster_file(tmp_path, [{"name": "box", "address": socket.gethostname(), "gpus": 1}])
    output = tmp_path / "out"
    args = ("--log-level", "error", "init", "--cluster-config", str(config), "--output", str(output))
    result = run_cli(*args, "--worker-env", "NCCL_NVLS_ENABLE=0", "--node-timeout", "30", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["simulated"] is False
    assert (output / "nccl.conf").is_file() and "box" in (output / "hostfile").read_text().splitlines()
    assert summary["baseline"]["sizes"][0]["time_us"] > 0, "NCCL's defaults were measured on the node's agent"
    assert "not this machine" not in result.stderr and "agent run" not in result.stderr
    assert not (output / ".topo-tune" / "agent-token").exists(), "no token leaves the process when nothing joins"
    assert "waiting for nodes: 0/1 ready" in result.stderr


@pytest.mark.skipif(bool(discover().gpus), reason="this machine has GPUs: examples/one-box.yaml would tune them")
def test_the_one_box_example_starts_a_real_nccl_agent_here_that_reports_the_missing_gpus(tmp_path: Path) -> None:
    # The nccl path itself, as far as a machine without GPUs goes: the file's only node is this machine, so
    # init starts its nccl agent (discovery and all), which registers; the pass then stops on what it reported.
    config: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "one-box.yaml").read_text())
    config["search"] = SEARCH
    path = tmp_path / "one-box.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ("init", "--cluster-config", str(path), "--output", str(tmp_path / "out"), "--node-timeout", "30")
    result = run_cli("--log-level", "error", *args, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "agent run" not in result.stderr, "no node elsewhere"
    assert "waiting for nodes: 0/1 ready" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "topo-tune: error: node gpu-box reports no GPU (its agent found none): backend nccl needs GPUs; "
        "to try topo-tune on CPUs, use backend gloo (examples/local-gloo.yaml)"
    )


def test_nodes_elsewhere_are_told_how_to_join_counted_and_named_when_missing(tmp_path: Path) -> None:
    # This machine (by address), and two nodes elsewhere (TEST-NET addresses): one joins with the printed
    # line, one never does.
    nodes = [
        {"name": "here-1", "address": "127.0.0.1", "gpus": 1},
        {"name": "far-1", "address": "192.0.2.10", "workerEnv": {"NCCL_NVLS_ENABLE": "1", "NCCL_DEBUG": "WARN"}},
        {"name": "far-2", "address": "192.0.2.11"},
    ]
    config = cluster_file(tmp_path, nodes, controller={"listen": "127.0.0.1:0"})
    output = tmp_path / "out"
    log = tmp_path / "init.err"
    command = [sys.executable, "-m", "topo_tune", "--log-level", "error", "init", "--cluster-config", str(config)]
    command += ["--output", str(output), "--node-timeout", "15", "--worker-env", "NCCL_NVLS_ENABLE=0"]
    with log.open("w") as err:
        init = subprocess.Popen(command, env=cli_env(), stdout=subprocess.DEVNULL, stderr=err)
    joined: subprocess.Popen[bytes] | None = None
    try:

        def agent_lines() -> dict[str, list[str]]:
            lines = [shlex.split(line) for line in log.read_text().splitlines() if "topo-tune agent run" in line]
            return {words[words.index("--node-name") + 1]: words for words in lines}

        lines = wait_until(lambda: len(agent_lines()) == 2 and agent_lines(), timeout=60, what="the agent lines")
        assert sorted(lines) == ["far-1", "far-2"], "no line for the node init runs itself"
        far = lines["far-1"]
        assert far[:3] == ["topo-tune", "agent", "run"]
        flags = dict(zip(far[3::2], far[4::2], strict=False))
        assert flags["--backend"] == "gloo" and flags["--rack"] == "rack-a" and flags["--address"] == "192.0.2.10"
        worker_env = [far[i + 1] for i, word in enumerate(far) if word == "--worker-env"]
        assert worker_env == ["NCCL_DEBUG=WARN", "NCCL_NVLS_ENABLE=0"], "the node's workerEnv, init's flag over it"
        assert lines["far-2"].count("--worker-env") == 1
        token = Path(flags["--token-file"])
        assert token.is_file() and stat.S_IMODE(token.stat().st_mode) == 0o600
        assert token.read_text().startswith("topo-tune-agent:far-1:"), "its own node's credential, not the admin token"
        # The line is the whole recipe: run it (with this test's directories) and far-1 joins.
        state = ["--state-dir", str(tmp_path / "far-1"), "--config-dir", str(tmp_path / "far-1" / "config")]
        joined = subprocess.Popen(
            [sys.executable, "-m", "topo_tune", *far[1:], *state],
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert init.wait(120) == 1
    finally:
        for process in (init, joined):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(30)
    text = log.read_text()
    first_wait = text.index("waiting for nodes:")
    assert text.index("topo-tune agent run") < first_wait, "the lines come before the wait"
    assert "controller.address" in text, "fleets are pointed at a long-lived controller"
    assert "waiting for nodes: 1/3 ready" in text and "waiting for nodes: 2/3 ready" in text, "a live count"
    error = text.strip().splitlines()[-1]
    assert error.startswith("topo-tune: error: 1 of 3 nodes not ready after 15 s: far-2 (never registered)"), error
    assert "far-1" not in error and "here-1" not in error


def test_worker_env_refused_by_the_policy_is_named(tmp_path: Path) -> None:
    config = cluster_file(tmp_path, [{"name": "box", "gpus": 1}])
    flag = run_cli(
        "init", "--cluster-config", str(config), "--output", str(tmp_path / "a"), "--worker-env", "LD_PRELOAD=x"
    )
    assert flag.returncode == 2 and "--worker-env" in flag.stderr and "LD_PRELOAD" in flag.stderr, flag.stderr
    config = cluster_file(tmp_path, [{"name": "box", "gpus": 1, "workerEnv": {"PATH": "/tmp"}}])
    file = run_cli("init", "--cluster-config", str(config), "--output", str(tmp_path / "b"))
    assert file.returncode == 1, file.stderr
    assert "racks[0].nodes[0].workerEnv" in file.stderr and "PATH" in file.stderr
    assert "Traceback" not in file.stderr + flag.stderr
    remote = cluster_file(tmp_path, [{"name": "box"}], controller={"address": "127.0.0.1:1"})
    elsewhere = run_cli("init", "--cluster-config", str(remote), "--worker-env", "NCCL_NVLS_ENABLE=0")
    assert elsewhere.returncode == 2 and "with controller.address, give it to each `agent run`" in elsewhere.stderr
