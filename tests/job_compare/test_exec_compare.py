"""``topo-tune exec --compare`` end to end: a controller and agents on loopback, two nodes' exec processes
started in different orders, a real gloo job per run; the comparison is stored and listed.

The version is stored at the controller (each arm's version and order are pinned there per job and arm) and
staged in each node's config directory with the agent's own ``ConfigStore.apply``, as the agent does when a
rollout applies it (a rollout's gates would only make the test slower).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import TOKEN, LocalCluster, cli_env, run_cli
from tests.support.waiting import STARTUP_TIMEOUT_S, wait_until
from topo_tune.agent.config_store import ConfigStore
from topo_tune.client.admin import AdminClient
from topo_tune.jobs.compare.schedule import Arm, arm_schedule
from topo_tune.versions.version import ConfigVersion

pytestmark = pytest.mark.slow

JOB_SCRIPT = Path(__file__).with_name("compare_job.py")
RING = ["n2", "n1"]
"""The version's ring puts n2 first; NCCL's defaults keep the launcher's order (n1 first): node rank 0 of a
run, which reads its metric, is n2 under the candidate and n1 under the against arm."""
VERSION = ConfigVersion(
    {
        "nccl.conf": "NCCL_MIN_NCHANNELS=4\n",
        "rankmap.json": json.dumps({"version": 1, "planned": {"node_order": RING}}),
    },
    {"study": "compare-test"},
)
UNSTAGED = ConfigVersion({"nccl.conf": "NCCL_MIN_NCHANNELS=8\n"}, {"study": "compare-test"})
"""Stored at the controller, staged on no node."""
METRIC = r"step_time=([0-9.]+)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("cluster")
    local = LocalCluster(workdir, f"sqlite:///{workdir / 'topo-tune.db'}")
    try:
        local.start_controller()
        for name in ("n1", "n2"):
            local.start_agent(name)
        # Registered, with the address node rank 0's peers are sent to (TOPO_TUNE_MASTER_ADDR).
        wait_until(
            lambda: (
                {n["name"] for n in json.loads(local.admin("nodes", "-o", "json").stdout) if n["address"]}
                == {"n1", "n2"}
            ),
            timeout=STARTUP_TIMEOUT_S,  # two Python processes starting on a machine that may be busy
            what="both agents registered",
        )
        with AdminClient(local.address, token=TOKEN) as admin:
            for version in (VERSION, UNSTAGED):
                admin.put_config_version(dict(version.files), dict(version.provenance))
        yield local
    finally:
        local.stop()


def _stage(config_dir: Path) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    ConfigStore(config_dir).apply(VERSION.id, VERSION.files)


def _exec(cluster: LocalCluster, node: str, nodes: str, *args: str, log: Path, store: Path) -> subprocess.Popen[str]:
    env = cli_env(
        TOPO_TUNE_CONTROLLER=cluster.address,
        TOPO_TUNE_NODE_NAME=node,
        TOPO_TUNE_CONFIG_DIR=str(cluster.workdir / f"config-{node}"),
        COMPARE_TEST_LOG=str(log),
        COMPARE_TEST_STORE=str(store),
    )
    command = [sys.executable, "-m", "topo_tune", "exec", "--nodes", nodes, "--job-id", "train-1", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(600)  # four runs of a Python job on each of two nodes: minutes on a busy 2-core machine
def test_two_nodes_started_in_different_orders_agree_and_the_comparison_is_stored(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    for name in ("n1", "n2"):
        _stage(cluster.workdir / f"config-{name}")
    log, store = tmp_path / "runs.log", tmp_path
    compare = ("--compare", VERSION.id, "--against", "defaults", "--pairs", "2", "--metric", METRIC)
    job = ("--", sys.executable, str(JOB_SCRIPT))
    # n2 starts first and lists the nodes the other way round; both derive the same schedule and ranks.
    second = _exec(cluster, "n2", "n2,n1", *compare, *job, log=log, store=store)
    time.sleep(1.0)  # not a wait for readiness: the point is that the order of the starts does not matter
    first = _exec(cluster, "n1", "n1,n2", *compare, *job, log=log, store=store)
    outputs = {name: p.communicate(timeout=480) for name, p in (("n1", first), ("n2", second))}
    for name, process in (("n1", first), ("n2", second)):
        assert process.returncode == 0, f"{name}: {outputs[name][1][-3000:]}"

    schedule = arm_schedule("train-1", 2)
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 2 * len(schedule)
    for run in schedule:
        seen = [line for line in lines if int(line[0]) == run.index]
        assert {line[1] for line in seen} == {"n1", "n2"}
        assert {line[2] for line in seen} == {run.arm.value}  # both nodes ran the same arm in each run
        assert {line[3] for line in seen} == {VERSION.id if run.arm is Arm.CANDIDATE else "defaults"}
        assert sorted(line[4] for line in seen) == ["0", "1"]  # distinct node ranks that met in one job
        first = RING[0] if run.arm is Arm.CANDIDATE else "n1"
        assert [line[1] for line in seen if line[4] == "0"] == [first]  # each arm's own order
    recorded = outputs["n1"][0] + outputs["n2"][0]
    assert re.search(r"gain (1\.9[5-9]|2\.0[0-4])\dx .*: faster", recorded), recorded

    comparisons = ("admin", "job", "comparisons", "--controller", cluster.address)
    listed = run_cli(*comparisons, "--job-id", "train-1", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    (comparison,) = json.loads(listed.stdout)
    assert comparison["complete"] and comparison["decision"] == "faster"
    assert 1.95 < comparison["gain"] < 2.05 and comparison["ci_low"] < comparison["gain"] < comparison["ci_high"]
    assert comparison["job"]["candidate_version"] == VERSION.id and comparison["job"]["against_version"] == ""
    assert [r["index"] for r in comparison["job"]["runs"]] == list(range(4))
    # Each node recorded the runs it read: the comparison was put together from both.
    assert {r["node"] for r in comparison["job"]["runs"]} == {"n1", "n2"}
    assert comparison["job"]["candidate_order"] == RING and comparison["job"]["against_order"] == ["n1", "n2"]
    table = run_cli(*comparisons, env=cli_env(COLUMNS="200"))
    assert "train-1" in table.stdout and "faster" in table.stdout


def test_an_arm_not_staged_here_fails_before_the_first_run(cluster: LocalCluster, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = cli_env(
        TOPO_TUNE_CONTROLLER=cluster.address,
        TOPO_TUNE_NODE_NAME="n1",
        TOPO_TUNE_CONFIG_DIR=str(cluster.workdir / "config-n1"),
    )
    args = ("exec", "--nodes", "n1", "--job-id", "j2", "--compare", UNSTAGED.id, "--against", "defaults")
    touch = ("--metric", METRIC, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    result = run_cli(*args, *touch, env=env)
    assert result.returncode == 1
    assert f"candidate arm {UNSTAGED.id}: version {UNSTAGED.id} is not staged on this node" in result.stderr
    assert "no run started on n1" in result.stderr and not marker.exists()


def test_a_failing_run_ends_the_comparison_with_its_status(cluster: LocalCluster) -> None:
    _stage(cluster.workdir / "config-n1")
    env = cli_env(
        TOPO_TUNE_CONTROLLER=cluster.address,
        TOPO_TUNE_NODE_NAME="n1",
        TOPO_TUNE_CONFIG_DIR=str(cluster.workdir / "config-n1"),
    )
    args = ("exec", "--nodes", "n1", "--job-id", "j3", "--compare", VERSION.id, "--against", "defaults")
    result = run_cli(*args, "--metric", METRIC, "--", sys.executable, "-c", "raise SystemExit(7)", env=env)
    assert result.returncode == 7
    assert "run 1/10 (pair 1," in result.stderr and "exited with status 7; the comparison ends" in result.stderr


def test_ctrl_c_ends_the_comparison_after_the_run_it_interrupted(cluster: LocalCluster) -> None:
    _stage(cluster.workdir / "config-n1")
    env = cli_env(
        TOPO_TUNE_CONTROLLER=cluster.address,
        TOPO_TUNE_NODE_NAME="n1",
        TOPO_TUNE_CONFIG_DIR=str(cluster.workdir / "config-n1"),
    )
    args = ["exec", "--nodes", "n1", "--job-id", "j5", "--compare", VERSION.id, "--against", "defaults"]
    args += ["--metric", METRIC, "--", sys.executable, "-c", "print('started', flush=True); input()"]
    process = subprocess.Popen(
        [sys.executable, "-m", "topo_tune", *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    assert process.stdout is not None and process.stdout.readline() == "started\n"
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "run 1/10" in stderr and "exited with status 130; the comparison ends" in stderr
    assert "run 2/10" not in stderr


def test_a_bad_metric_names_the_flag() -> None:
    args = ("exec", "--nodes", "n1", "--job-id", "j4", "--compare", "stable", "--against", "defaults")
    result = run_cli(*args, "--metric", "step_time=[0-9.]+", "--", "true")
    assert result.returncode == 1 and "--metric: needs a group" in result.stderr
