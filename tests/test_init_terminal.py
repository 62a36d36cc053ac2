"""What a person sees from ``topo-tune init``: phase lines, no log flood, no library chatter, and how to resume."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from tests.support.processes import cli_env, run_cli
from tests.support.waiting import wait_until
from topo_tune.cli.phases import PhaseDisplay, eta_text, phase_of
from topo_tune.tuner.study import StudyProgress

pytestmark = pytest.mark.slow  # each test runs `topo-tune init` with its controller and agents

SMALL = yaml.safe_load(
    """
apiVersion: topo-tune/v1
kind: Cluster
metadata: {name: small}
backend: sim
racks: [{name: r1, nodes: [{name: a, gpus: 2}, {name: b, gpus: 2}]}]
workload: {collectives: {all_reduce: 1}}
search: {budget: 4, seed: 0, finalists: 1, proofPairs: 2, proofPairsMax: 2, minBytes: 1M, maxBytes: 4M,
         tunerTable: false}
"""
)


def test_init_is_quiet_by_default_logs_to_its_output_and_v_brings_the_log_back(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(SMALL))
    quiet = run_cli("init", "--cluster-config", "small.yaml", timeout=300, cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    lines = quiet.stderr.splitlines()
    assert not [line for line in lines if " INFO " in line], "no INFO line on the terminal"
    assert not [line for line in lines if line.startswith("[I ") or line.startswith("[W ")], "no Optuna lines"
    log = tmp_path / "topo-tune-output" / ".topo-tune" / "init.log"
    assert f"log: {log} (-v shows it here)" in quiet.stderr
    assert "waiting for nodes: 0/2 ready" in lines
    assert [line for line in lines if line.startswith("searching: 4 trials (tpe")], "the search's phase line"
    assert f"writing outputs to {tmp_path / 'topo-tune-output'}" in lines
    logged = log.read_text()
    assert " INFO    topo_tune.tuner.study: trial 1 " in logged, "the INFO lines are in the file"
    assert "A new study created" not in logged, "Optuna's INFO chatter is kept out, even of the file"
    assert len(lines) < 60, lines

    verbose = run_cli("-v", "init", "--cluster-config", "small.yaml", "--output", "again", timeout=300, cwd=tmp_path)
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert " INFO    topo_tune.tuner.study: trial 1 " in verbose.stderr


def test_ctrl_c_says_how_to_resume(tmp_path: Path) -> None:
    # A node elsewhere that never comes: init waits for it, and is interrupted while it waits.
    config = {**SMALL, "backend": "gloo", "controller": {"listen": "127.0.0.1:0"}}
    config["racks"] = [{"name": "r1", "nodes": [{"name": "far", "address": "192.0.2.10"}]}]
    (tmp_path / "far.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "init.err"
    command = [sys.executable, "-m", "topo_tune", "init", "--cluster-config", "far.yaml", "--node-timeout", "120"]
    env = cli_env(PYTHONFAULTHANDLER="1")  # SIGABRT then writes every thread's stack to the log
    # A terminal's Ctrl-C reaches a foreground init. A suite started in the background (`make test &` from a
    # non-interactive shell) ignores SIGINT, and a child inherits an ignored signal, so init would rightly ignore
    # it too: start it with SIGINT at its default, as a terminal's foreground job has it.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with log.open("w") as err:
            init = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    finally:
        signal.signal(signal.SIGINT, ignored)
    try:
        wait_until(lambda: "waiting for nodes: 0/1 ready" in log.read_text(), timeout=60, what="init to wait")
        init.send_signal(signal.SIGINT)
        # Bounded below the node timeout (120 s): an init that missed the signal ends there with another status.
        try:
            status = init.wait(100)
        except subprocess.TimeoutExpired:
            init.send_signal(signal.SIGABRT)
            init.wait(30)
            inner = (tmp_path / "topo-tune-output" / ".topo-tune" / "init.log").read_text()[-4000:]
            pytest.fail(f"init still runs 100 s after SIGINT; its stacks:\n{log.read_text()}\n{inner}")
        assert status == 130
    finally:
        if init.poll() is None:
            init.kill()
            init.wait(30)
    text = log.read_text()
    assert "Aborted!" not in text and "Traceback" not in text, text
    assert "interrupted: every finished trial is kept in" in text
    assert "the same command resumes the study:\n  topo-tune init --cluster-config far.yaml --node-timeout 120" in text


def _progress(phase: str, done: int, total: int, eta: float | None = None) -> StudyProgress:
    return StudyProgress(phase, done, total, 1.2 if done else None, eta)  # type: ignore[arg-type]


def test_phase_lines_without_a_terminal_each_once() -> None:
    console = Console(file=open("/dev/null", "w"), force_terminal=False)  # noqa: SIM115 - closed with the console
    said: list[str] = []
    console.print = lambda text, **_: said.append(str(text))  # type: ignore[method-assign]
    with PhaseDisplay(console) as phases:
        phases.status("waiting for nodes: 0/2 ready")
        phases.status("waiting for nodes: 0/2 ready")
        phases.status("waiting for nodes: 1/2 ready, missing b")
        phases.status("probing 1 node pairs")
        phases.status("searching: 4 trials (tpe), then proving 1 finalists")
        for done in range(5):
            phases.study(_progress("search", done, 4, eta=3.0))
        phases.study(_progress("proof", 1, 2))
        phases.study(_progress("proof", 2, 2))
        phases.study(_progress("done", 2, 2))
        phases.status("writing outputs to out")
    console.file.close()
    assert said == [
        "waiting for nodes: 0/2 ready",
        "waiting for nodes: 1/2 ready, missing b",
        "probing 1 node pairs",
        "searching: 4 trials (tpe), then proving 1 finalists",
        "proving the finalists against NCCL's defaults (A/B pairs)",
        "writing outputs to out",
    ]


@pytest.mark.parametrize(
    ("text", "phase"),
    [("waiting for nodes: 1/3 ready", "nodes"), ("probing 3 node pairs", "probe"), ("one rank in all: ...", None)],
)
def test_status_lines_map_to_phases(text: str, phase: str | None) -> None:
    assert phase_of(text) == phase


def test_eta_from_the_study_or_from_the_phase_rate() -> None:
    assert eta_text(_progress("search", 2, 10, eta=41.6), phase_started=0.0, now=5.0) == "ETA 42s"
    assert eta_text(_progress("proof", 2, 6), phase_started=0.0, now=10.0) == "ETA 20s", "5 s a pair, 4 to go"
    assert eta_text(_progress("proof", 0, 6), phase_started=0.0, now=10.0) == ""


def test_without_a_terminal_a_long_phase_prints_its_count_at_most_once_a_minute() -> None:
    console = Console(file=open("/dev/null", "w"), force_terminal=False)  # noqa: SIM115 - closed with the console
    said: list[str] = []
    console.print = lambda text, **_: said.append(str(text))  # type: ignore[method-assign]
    now = [0.0]
    with PhaseDisplay(console, clock=lambda: now[0]) as phases:
        for done in range(0, 121):
            now[0] = done * 3.5  # a proof job every 3.5 s, as one H200's workers take
            phases.study(_progress("proof", done, 120))
    console.file.close()
    proving = "proving the finalists against NCCL's defaults (A/B pairs)"
    assert said[0] == proving
    counts = said[1:]
    assert [line.split(": ")[1].split(",")[0] for line in counts] == [
        "18/120",
        "36/120",
        "54/120",
        "72/120",
        "90/120",
        "108/120",
    ], "a count line at most once a minute, never silent for longer"
    assert counts[0] == f"{proving}: 18/120, search best 1.200x, 1m03s, ETA 357s"
