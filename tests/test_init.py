"""`topo-tune init` end to end through the real CLI: real gloo collectives, and a resume after SIGKILL."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
import yaml

from tests.support.processes import cli_env, run_cli
from tests.support.waiting import wait_until
from topo_tune.plugin.table import parse_tuner_table
from topo_tune.tuner.objective import Measurements

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = ("nccl.conf", "nccl_tuner.conf", "hostfile", "rankmap.json", "summary.json", "report.html")


def study_of(output: Path, summary: dict[str, object]) -> optuna.Study:
    name = summary["study"]["name"]  # type: ignore[index]
    return optuna.load_study(study_name=name, storage=f"sqlite:///{output / '.topo-tune' / 'topo-tune.db'}")


@pytest.mark.timeout(600)  # two runs of real gloo jobs: minutes when other work shares the two cores
def test_gloo_init_runs_real_collectives_and_writes_every_output(tmp_path: Path) -> None:
    # As a user runs it from a clone: relative paths, the default (relative) output directory.
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    output = tmp_path / "topo-tune-output"
    command = ("--log-level", "error", "init", "--cluster-config", "examples/local-gloo.yaml")
    result = run_cli(*command, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in OUTPUTS:
        assert (output / name).is_file(), name
    assert list((output / "plots").glob("*.png"))
    summary = json.loads((output / "summary.json").read_text())
    assert summary["simulated"] is False
    assert summary["result"] in ("keep NCCL's defaults", "promote")
    # The numbers in summary.json are the ones stored in the database.
    study = study_of(output, summary)
    stored = {t.number: t for t in study.trials}
    assert len(summary["trials"]) == 6
    for trial in summary["trials"]:
        if trial["value"] is not None:
            assert stored[trial["number"]].value == pytest.approx(trial["value"])
    # The counts init prints are the database's: trials, and finalists (never "1 finalists").
    assert summary["counts"]["trials"] == len(stored) and f"{len(stored)} trials: " in result.stderr
    proven = {k.split(":")[1] for k in study.user_attrs if k.startswith("proof:") and k.endswith(":0")}
    finalists = f"{len(proven)} finalist{'' if len(proven) == 1 else 's'} proven against the defaults"
    assert summary["counts"]["finalists"] == len(proven) and finalists in result.stderr
    engine = sa.create_engine(f"sqlite:///{output / '.topo-tune' / 'topo-tune.db'}")
    with engine.connect() as connection:
        jobs = connection.execute(sa.text("SELECT backend, status FROM benchmark_jobs")).all()
        pairs = connection.execute(sa.text("SELECT count(*) FROM pair_measurements")).scalar_one()
        versions = connection.execute(sa.text("SELECT id FROM config_versions")).scalars().all()
    engine.dispose()
    assert jobs and {backend for backend, _ in jobs} == {"gloo"}
    assert pairs == 3, "three nodes: three probed pairs"
    assert summary["config_version"] in versions, "the result is stored as a config version"
    # stdout carries one JSON line for scripts.
    assert json.loads(result.stdout.strip().splitlines()[-1])["output"] == str(output)
    # The same command again in the same directory: the finished study resumes and writes the same result.
    again = run_cli(*command, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["config_version"] == summary["config_version"]


def small_demo(*, budget: int) -> dict[str, Any]:
    """The demo cluster cut to two racks of two nodes, with a short search and proof."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "demo-cluster.yaml").read_text())
    config["racks"] = [
        {"name": "rack-a", "nodes": [{"name": "node-01", "gpus": 8}, {"name": "node-03", "gpus": 8}]},
        {"name": "rack-b", "nodes": [{"name": "node-02", "gpus": 8}, {"name": "node-04", "gpus": 8}]},
    ]
    config["search"].update({"budget": budget, "rungs": 1, "finalists": 1, "proofPairs": 2})
    return config


@dataclass(frozen=True)
class SeededRuns:
    """Two real runs of one seeded sim study (the small demo, tuner table on), started at the same time."""

    first: Path
    second: Path
    first_stderr: str
    """The first run's terminal (``--log-level info``), for the tests that read what init says."""
    first_lines: tuple[tuple[float, str], ...]
    """The first run's terminal by line, each with the time it reached this process (``time.monotonic``)."""


@pytest.fixture(scope="module")
def seeded_runs(tmp_path_factory: pytest.TempPathFactory) -> SeededRuns:
    """Shared by the byte-for-byte test (which compares the two) and the tuner-table test (which reads the
    first as its "on" case): each init run is tens of seconds of CPU. The first logs at INFO and the second at
    ERROR, so their identical files also show that the log level changes no output."""
    directory = tmp_path_factory.mktemp("seeded")
    config = small_demo(budget=10)
    config["search"]["proofPairs"] = 3
    cluster_file = directory / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(config))
    runs = []
    for name, level in (("first", "info"), ("second", "error")):
        command = [sys.executable, "-m", "topo_tune", "--log-level", level, "init"]
        command += ["--cluster-config", str(cluster_file), "--output", str(directory / name)]
        run = subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        runs.append((run, _timed_lines(run)))
    errors = []
    for run, lines in runs:
        run.wait(timeout=400)
        text = "".join(line for _, line in lines.result(timeout=60))
        assert run.returncode == 0, text[-3000:]
        errors.append(text)
    return SeededRuns(directory / "first", directory / "second", errors[0], tuple(runs[0][1].result()))


def _timed_lines(run: subprocess.Popen[str]) -> Future[list[tuple[float, str]]]:
    """``run``'s stderr lines as they arrive, each with its arrival time; its stdout read to the end beside."""
    assert run.stdout is not None and run.stderr is not None
    out, err = run.stdout, run.stderr
    lines: Future[list[tuple[float, str]]] = Future()

    def drain() -> None:  # a full stdout pipe would stall the run
        with out:
            out.read()

    def read() -> None:
        with err:
            lines.set_result([(time.monotonic(), line) for line in err])

    for target in (drain, read):
        threading.Thread(target=target, daemon=True).start()
    return lines


def assert_last_lines_show_the_buckets(stderr: str, summary: dict[str, Any]) -> None:
    """init's last lines: the decision, and per weighted bucket of the chosen or trade-off finalist its
    speedup, bounds, decision and pairs, as summary.json has them."""
    lines = stderr.rstrip().splitlines()
    head = max(i for i, line in enumerate(lines) if line.startswith(("promoted trial", "keep NCCL's defaults:")))
    shown = summary["buckets"] if summary["chosen"] else (summary["tradeoff"] or {}).get("buckets", [])
    expected = [
        f"  {r['collective']:<14} {r['bucket']:<7} {r['speedup_text']} {r['decision']} ("
        + (
            f"{r['pairs']} pairs"
            if r["decided_at_pairs"] >= r["pairs"]
            else f"decided at {r['decided_at_pairs']} of {r['pairs']} pairs"
        )
        + ")"
        for r in shown
        if r["weight"] > 0
    ]
    assert expected and all(line in lines[head:] for line in expected), lines[head:]
    assert {r["decision"] for r in shown} <= {"faster", "no difference shown", "not shown safe", "slower"}


def test_init_resumes_after_sigkill_with_every_trial_counted_once(tmp_path: Path) -> None:
    config = small_demo(budget=14)
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(config))
    output = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "topo_tune",
        "--log-level",
        "error",
        "init",
        "--cluster-config",
        str(cluster_file),
        "--output",
        str(output),
    ]
    first = subprocess.Popen(command, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    database = output / ".topo-tune" / "topo-tune.db"

    def completed_trials() -> int:
        if not database.exists() or first.poll() is not None:
            return 0 if first.poll() is None else 99
        engine = sa.create_engine(f"sqlite:///{database}")
        try:
            with engine.connect() as connection:
                return int(
                    connection.execute(sa.text("SELECT count(*) FROM trials WHERE state = 'COMPLETE'")).scalar_one()
                )
        except sa.exc.OperationalError:
            return 0
        finally:
            engine.dispose()

    # Poll gently: a reader hammering SQLite can starve the writer's lock for the journal-mode switch.
    wait_until(lambda: completed_trials() >= 4, timeout=240, interval=0.5, what="four finished trials")
    assert first.poll() is None, "the first run must still be running when it is killed"
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    time.sleep(0.1)

    second = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=300, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    after_budget = ("table", "option", "per_size")  # the composed tables and the per-size search
    counted = [t for t in summary["trials"] if not t["superseded"] and t["role"] not in after_budget]
    assert len(counted) == 14, "every trial of the budget counted once, none lost"
    tables = [t for t in summary["trials"] if not t["superseded"] and t["role"] == "table"]
    assert len(tables) <= 1, "the composed tuner table is measured once, after the budget"
    assert len({t["number"] for t in summary["trials"]}) == len(summary["trials"]), "no trial number twice"
    assert summary["simulated"] is True


def test_search_tuner_table_off_runs_no_table_trial_and_ships_no_table(tmp_path: Path, seeded_runs: SeededRuns) -> None:
    # On (the default): the shared seeded run. The study composes a table from the search's per-bucket winners
    # (rows), or says none asks for one.
    summary_on = json.loads((seeded_runs.first / "summary.json").read_text())
    tables_on = [t["role"] for t in summary_on["trials"]].count("table")
    composed_on = any(
        text in seeded_runs.first_stderr for text in ("table row: ", "no size bucket asks for its own channel count")
    )
    assert composed_on and tables_on <= 1, "on (the default), the study tries to compose a table"
    assert_last_lines_show_the_buckets(seeded_runs.first_stderr, summary_on)
    config = small_demo(budget=10)
    config["search"]["tunerTable"] = False
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(config))
    output = tmp_path / "out"
    args = ("--log-level", "info", "init", "--cluster-config", str(cluster_file), "--output", str(output))
    result = run_cli(*args, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert_last_lines_show_the_buckets(result.stderr, summary)
    tables = [t["role"] for t in summary["trials"]].count("table")
    composed = "table row: " in result.stderr or "no size bucket asks for its own channel count" in result.stderr
    assert (tables, composed) == (0, False), "off: no table composed, no table trial"
    table = (output / "nccl_tuner.conf").read_text()
    assert [line for line in table.splitlines() if line and not line.startswith("#")] == [], (
        "off: nccl_tuner.conf carries no row"
    )
    version_id = summary["config_version"]
    engine = sa.create_engine(f"sqlite:///{output / '.topo-tune' / 'topo-tune.db'}")
    with engine.connect() as connection:
        query = sa.text("SELECT files FROM config_versions WHERE id = :id")
        files = json.loads(connection.execute(query, {"id": version_id}).scalar_one())
    engine.dispose()
    assert "nccl.conf" in files and "nccl_tuner.conf" not in files, "the stored version has no plugin table"


def test_init_on_a_tradeoff_cluster_proves_per_size_tables_of_entries_nccl_offered_and_ships_no_loss(
    tmp_path: Path,
) -> None:
    # Rack-grouped rings double large all_reduce and slow the tree-sized ones (SIMULATED). The per-size search
    # composes tables of NCCL's own entries and proves them like any finalist; one is shown safe everywhere and
    # ships. No shipped bucket may be slower: a table is the result only when shown safe everywhere.
    output = tmp_path / "out"
    config = ROOT / "examples" / "tradeoff-cluster.yaml"
    result = run_cli("init", "--cluster-config", str(config), "--output", str(output), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["simulated"] is True
    trials = {t["number"]: t for t in summary["trials"]}
    proven_tables = [trials[f["trial"]] for f in summary["finalists"] if trials[f["trial"]]["role"] == "per_size"]
    assert proven_tables, "a composed per-size table is one of the finalists"
    storage = f"sqlite:///{output / '.topo-tune' / 'topo-tune.db'}"
    stored = optuna.load_study(study_name=summary["study"]["name"], storage=storage).trials
    named = 0
    for table in proven_tables:
        # Every explicit row names an entry NCCL offered at every measured size of its bucket under its base.
        (base,) = [
            t
            for t in summary["trials"]
            if t["role"] in ("baseline", "candidate", "sampled")
            and (t["env"], t["rank_order"]) == (table["env"], table["rank_order"])
            and t["state"] == "complete"
        ][:1]
        samples = Measurements.from_json(stored[base["number"]].user_attrs["measurements"]).samples
        for row in parse_tuner_table(table["tuner_table"]):
            if row.algorithm is None:
                continue
            named += 1
            sizes = [s for s in samples if s.collective == "all_reduce" and row.min_bytes <= s.bytes <= row.max_bytes]
            assert sizes and all(f"{row.algorithm}/{row.protocol}" in s.offered for s in sizes), row
    assert named, "the per-size search composed rows with an explicit algorithm and protocol"
    # What ships is a proven per-size table that names an algorithm, shown safe in every weighted bucket.
    assert summary["chosen"] is not None, summary["tradeoff"]
    chosen = trials[summary["chosen"]["trial"]]
    assert (output / "nccl_tuner.conf").read_text() == chosen["tuner_table"], "what ships is what was proven"
    assert any(row.algorithm is not None for row in parse_tuner_table(chosen["tuner_table"])), chosen["tuner_table"]
    weighted = [b for b in summary["buckets"] if b["weight"] > 0]
    assert all(b["ci_low"] >= 1 - summary["decision_rule"]["max_loss"] for b in weighted), weighted
    tradeoff = summary["tradeoff"]
    if tradeoff is not None:  # the rack-grouped ring, faster overall but not shown safe: named, never shipped
        assert tradeoff["not_shown_safe"] and tradeoff["trial"] != chosen["number"]
        assert (output / "tradeoff" / "nccl_tuner.conf").read_text() == tradeoff["tuner_table"]


def test_an_output_directory_that_cannot_be_made_is_refused_naming_the_option(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file, not a directory")
    args = ("init", "--cluster-config", str(ROOT / "examples" / "demo-cluster.yaml"))
    result = run_cli(*args, "--output", str(tmp_path / "taken" / "out"))
    assert result.returncode == 2 and "--output" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_a_seeded_sim_study_reproduces_byte_for_byte(seeded_runs: SeededRuns) -> None:
    """Two runs of one seeded sim study, at the same time (so jobs interleave and finish in a different order):
    the same trials, the same result, and identical output files."""
    first, second = seeded_runs.first, seeded_runs.second
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file() and ".topo-tune" not in p.parts)
    assert {str(f) for f in files} >= set(OUTPUTS)
    assert files == sorted(
        p.relative_to(second) for p in second.rglob("*") if p.is_file() and ".topo-tune" not in p.parts
    )
    summaries = [json.loads((run / "summary.json").read_text()) for run in (first, second)]
    assert summaries[0]["trials"] == summaries[1]["trials"], "the same trials, measured alike"
    assert summaries[0] == summaries[1], "the same result"
    for name in files:
        if str(name) == "cluster-time.json":  # wall-clock seconds: the one output that differs between runs
            continue
        assert (first / name).read_bytes() == (second / name).read_bytes(), f"{name} differs between the runs"
    times = [json.loads((run / "cluster-time.json").read_text()) for run in (first, second)]
    for data in times:
        assert [p["phase"] for p in data["phases"]] == ["nodes", "probe", "search", "proof", "outputs"]
        assert data["simulated"] is True and "SIMULATED" in data["note"]
    # What the runs did is the same; only how long it took differs.
    assert [p["jobs"] for p in times[0]["phases"]] == [p["jobs"] for p in times[1]["phases"]]


def test_init_prints_its_cluster_time_and_it_is_the_phases_as_measured_from_outside(seeded_runs: SeededRuns) -> None:
    """The cluster time init reports (printed and in cluster-time.json) against the pass's phases timed by this
    test: from the first phase's first line ("waiting for nodes") to the line printed after the last one ended."""
    data = json.loads((seeded_runs.first / "cluster-time.json").read_text())
    started = next(at for at, line in seeded_runs.first_lines if line.startswith("waiting for nodes"))
    ended, head = next((at, line) for at, line in seeded_runs.first_lines if line.startswith("cluster time:"))
    assert head.startswith(f"cluster time: {data['wall_s']:.1f} s wall, {data['node_s']:.0f} node-seconds")
    printed = [line.strip() for _, line in seeded_runs.first_lines]
    for phase in data["phases"]:  # a line per phase, as the file has it
        assert any(line.startswith(f"{phase['phase']}: {phase['wall_s']:.1f} s, ") for line in printed), phase
    measured = ended - started
    assert data["wall_s"] == pytest.approx(sum(p["wall_s"] for p in data["phases"]), abs=0.01)
    assert abs(data["wall_s"] - measured) <= 0.1 * measured, (data["wall_s"], measured)


@pytest.mark.parametrize("gpus", [1, 2])
def test_init_says_up_front_when_one_rank_in_all_has_nothing_to_tune(tmp_path: Path, gpus: int) -> None:
    # One GPU box with one GPU: a single-rank collective moves no data, so a user is told before the search.
    config = tmp_path / "cluster.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "topo-tune/v1",
                "kind": "Cluster",
                "metadata": {"name": "one-rank"},
                "backend": "sim",
                "racks": [{"name": "r1", "nodes": [{"name": "solo", "gpus": gpus}]}],
                "workload": {"collectives": {"all_reduce": 1}},
                "search": {
                    "budget": 2,
                    "finalists": 1,
                    "proofPairs": 2,
                    "proofPairsMax": 2,
                    "minBytes": "1M",
                    "maxBytes": "4M",
                    "tunerTable": False,
                },
            }
        )
    )
    result = run_cli("--log-level", "error", "init", "--cluster-config", str(config), "--output", str(tmp_path / "o"))
    assert result.returncode == 0, result.stderr[-3000:]
    warned = "one rank in all: a collective on one rank moves no data" in " ".join(result.stderr.split())
    assert warned == (gpus == 1), result.stderr[-3000:]
