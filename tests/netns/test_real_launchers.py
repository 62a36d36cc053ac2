"""Jobs started by the real launchers (Slurm 22.05, Open MPI 4.1, torchrun) on namespace hosts get the version's
node order: the ranks' hosts follow it, and on shaped links a 16 MiB gloo all_reduce shows what that is worth.

One cluster for the module (``tests/support/launcher_cluster.py``): five hosts ``a``..``e`` plus the login host
``head`` (slurmctld and the controller, no agent), every pair linked at 800 Mbit/s except ``a-b`` and ``c-d`` at
100. The launcher's order (sorted names) rings over both slow links; the staged version's rank map (its pair
matrix: those rates) gives ``a c b d e``, a ring of fast links only. The version is rolled out for real (a
gate measures it against the launcher's order), so every host's agent stages it in its own config directory.

Tests marked ``xfail(strict=True)`` show a defect in the product as it stands (each reason names it); they pass,
and the mark goes, with the fix.

Non-goals: GPUs and NCCL (gloo's ring follows the rank order as NCCL's inter-node ring does).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.launcher_cluster import HEAD, LauncherCluster, launchers_missing
from tests.support.netns import ClusterShape, NamespacesUnavailable, check_namespaces_allowed
from tests.support.processes import cli_env
from tests.support.waiting import wait_until
from tests.tuner.test_job_order import rank_map_of
from topo_tune.versions.version import ConfigVersion, render_nccl_conf

pytestmark = [
    pytest.mark.netns,
    pytest.mark.timeout(600),
]  # the first test also builds the cluster: minutes on a busy machine

HOSTS = ["a", "b", "c", "d", "e"]
FAST_MBIT, SLOW_MBIT = 800.0, 100.0
SLOW = (frozenset(("a", "b")), frozenset(("c", "d")))
SHAPE = ClusterShape(racks={"r1": HOSTS}, rack_mbit=FAST_MBIT, pair_mbit=dict.fromkeys(SLOW, SLOW_MBIT))
ORDER = ["a", "c", "b", "d", "e"]
"""The version's ring over all five hosts: fast links only."""
SUBSET, SUBSET_ORDER = ["b", "c", "d", "e"], ["c", "b", "d", "e"]
"""A job on four hosts: its order starts at c, although Slurm's first node (where the batch script runs) is b."""

BIN = Path(sys.executable).parent
REPORT = Path(__file__).resolve().parents[1] / "support" / "rank_report.py"
RANK_CMD = f"{BIN / 'topo-tune'} exec -- {sys.executable} {REPORT}"
"""What every rank runs: the inner ``exec`` (this node's variables from the pinned job), then the report."""
GATES = [
    "--no-canary", "--gate-repeats", "2", "--gate-min-bytes", "1M", "--gate-max-bytes", "1M",
    "--gate-iters", "3", "--gate-warmup-iters", "1", "--threshold", "alpha=0.3", "--threshold", "max_cv=0.5",
    "--threshold", "max_p99_regression=0.5",
]  # fmt: skip


def version() -> ConfigVersion:
    gbps = {pair: mbit / 8000 for pair, mbit in SHAPE.pair_mbit.items()}
    bandwidth = [[gbps.get(frozenset((x, y)), FAST_MBIT / 8000) for y in HOSTS] for x in HOSTS]
    rank_map = rank_map_of(HOSTS, bandwidth, order=ORDER)
    return ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_DEBUG": "WARN"}), "rankmap.json": rank_map})


@dataclass
class Box:
    cluster: LauncherCluster
    version: ConfigVersion
    env: dict[str, str]
    """What a user's shell on any host has: topo-tune on PATH, the controller, a token, the config dir."""

    def run(
        self, host: str, argv: Sequence[str], *, timeout: float = 180, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cluster.exec_argv(host, argv),
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def sbatch(self, script: str, *options: str) -> tuple[subprocess.CompletedProcess[str], str]:
        """Submit ``script`` from ``head`` and wait for the job; its output file's text."""
        output = self.cluster.workdir / f"job-{len(list(self.cluster.workdir.glob('job-*.out')))}.out"
        argv = ["sbatch", "--wait", f"--output={output}", *options, "--wrap", script]
        done = self.run(HEAD, argv)
        return done, output.read_text(errors="replace") if output.exists() else ""


def reports(output: str) -> list[dict[str, str]]:
    return [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith("rank-report ")]


def hosts_by(found: list[dict[str, str]], key: str) -> list[str]:
    """The ranks' hosts in the order of ``key`` (a launcher's rank variable)."""
    return [report["host"] for report in sorted(found, key=lambda report: int(report[key]))]


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    try:
        check_namespaces_allowed()
    except NamespacesUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    missing = launchers_missing()
    assert not missing, f"{', '.join(missing)} not installed: `make slurm openmpi` installs them"
    cluster = LauncherCluster(
        SHAPE, tmp_path_factory.mktemp("launchers"), heartbeat_interval=1.0, heartbeat_expiry=10.0, start_timeout=120.0
    )
    try:
        cluster.build()
        cluster.start_controller(f"sqlite:///{cluster.workdir / 'topo-tune.db'}")
        cluster.start_agents()
        staged = version()
        files = []
        for name, text in staged.files.items():
            path = cluster.workdir / name
            path.write_text(text)
            files += ["--file", f"{name}={path}"]
        cluster.admin_json("rollout", "create", *files, "--id", "ro-order", "--yes", *GATES)
        wait_until(
            lambda: (
                cluster.admin_json("rollout", "status", "ro-order")["phase"]
                in ("completed", "rolled_back", "paused", "aborted")
            ),  # type: ignore[index]
            timeout=240,
            interval=0.5,
            what="the rollout of the ordered version",
        )
        status = cluster.admin_json("rollout", "status", "ro-order")
        assert status["phase"] == "completed", status  # type: ignore[index]
        cluster.start_slurm()
        env = cli_env(
            PATH=f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            TOPO_TUNE_CONTROLLER=cluster.controller_address,
            TOPO_TUNE_CONFIG_DIR=str(cluster.config_dir),
            SLURM_CONF=str(cluster.slurm.conf),  # type: ignore[union-attr]
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            OMPI_MCA_plm_rsh_agent=str(cluster.rsh_agent),
        )
        yield Box(cluster, staged, env)
    finally:
        print(cluster.logs())
        cluster.close()


def test_sbatch_srun_ranks_follow_the_version_order(box: Box) -> None:
    script = f"topo-tune exec --launcher slurm -- srun {RANK_CMD}"
    done, output = box.sbatch(script, "--nodes=5")
    found = reports(output)
    assert done.returncode == 0 and len(found) == 5, f"{done.stderr}\n{output}"
    assert hosts_by(found, "SLURM_PROCID") == ORDER
    assert {r["TOPO_TUNE_CONFIG_VERSION"] for r in found} == {box.version.id}
    # SLURM_NODEID keeps Slurm's own order (sorted names): only the ranks follow the version's.
    assert hosts_by(found, "SLURM_NODEID") == HOSTS
