"""Jobs started by the real launchers (Slurm 22.05, Open MPI 4.1, torchrun) on namespace hosts get the version's
node order: the ranks' hosts follow it, and on shaped links a 16 MiB gloo all_reduce shows what that is worth.

One cluster for the module (``tests/support/launcher_cluster.py``): five hosts ``a``..``e`` plus the login host
``head`` (slurmctld and the controller, no agent), every pair linked at 800 Mbit/s except ``a-b`` and ``c-d`` at
100. The launcher's order (sorted names) rings over both slow links; the staged version's rank map (its pair
matrix: those rates) gives ``a c b d e``, a ring of fast links only. The version is rolled out for real (a
gate measures it against the launcher's order), so every host's agent stages it in its own config directory.

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
    "--gate-iters", "3", "--gate-warmup-iters", "1", "--threshold", "alpha=0.3", "--threshold", "max_cv=0.9",
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

    def sbatch(self, script: str, *options: str, wait: bool = True) -> Job:
        """Submit ``script`` from ``head``; with ``wait``, wait for the job to end and read its output file.
        (Not ``sbatch --wait``: it polls with a growing back-off, tens of seconds after a short job ends.)"""
        output = self.cluster.workdir / f"job-{len(list(self.cluster.workdir.glob('job-*.out')))}.out"
        output.touch()
        submitted = self.run(HEAD, ["sbatch", "--parsable", f"--output={output}", *options, "--wrap", script])
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip().split(";")[0]
        if not wait:
            return Job(job, "", "")

        def ended() -> str:
            shown = self.run(HEAD, ["scontrol", "show", "job", "--oneliner", job]).stdout
            state = shown.split("JobState=", 1)[1].split()[0] if "JobState=" in shown else ""
            return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else ""

        state = wait_until(ended, timeout=240, interval=0.3, what=f"Slurm job {job} to end")
        return Job(job, state, output.read_text(errors="replace"))


@dataclass(frozen=True)
class Job:
    """A batch job: its id, how it ended and what it printed."""

    id: str
    state: str
    output: str


def reports(output: str) -> list[dict[str, str]]:
    """Every rank's report in ``output``, wherever the launcher's output forwarding put it: Open MPI's sometimes
    joins two ranks' lines into one (``rank-report {...}rank-report {...}``), so reports are found, not split
    by lines."""
    decoder = json.JSONDecoder()
    found: list[dict[str, str]] = []
    start = output.find(_REPORT)
    while start != -1:
        report, end = decoder.raw_decode(output, start + len(_REPORT))
        found.append(report)
        start = output.find(_REPORT, end)
    return found


_REPORT = "rank-report "


def ranked_hosts(output: str, key: str, *, ok: bool, problem: str, count: int = len(HOSTS)) -> list[str]:
    """The hosts of a job's ``count`` ranks in the order of ``key``, once it is known to have ended well (``ok``;
    ``problem``: what to show when not)."""
    found = reports(output)
    assert ok and len(found) == count, problem[-3000:]
    return hosts_by(found, key)


def hosts_by(found: list[dict[str, str]], key: str) -> list[str]:
    """The ranks' hosts in the order of ``key`` (a launcher's rank variable)."""
    return [report["host"] for report in sorted(found, key=lambda report: int(report[key]))]


def _rollout_ended(cluster: LauncherCluster) -> str:
    """Wait for the staging rollout to stop (completed, or paused by an inconclusive gate); its phase."""

    def phase() -> str:
        status = cluster.admin_json("rollout", "status", "ro-order")
        assert isinstance(status, dict)
        return str(status["phase"]) if status["phase"] in ("completed", "rolled_back", "paused", "aborted") else ""

    return wait_until(phase, timeout=240, interval=0.5, what="the rollout of the ordered version")


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
        if _rollout_ended(cluster) == "paused":
            # A gate can be inconclusive when other work shares the machine; the operator's promote then stages
            # it all the same (staging, not the gate, is what these tests need).
            cluster.admin_json("rollout", "promote", "ro-order")
        assert _rollout_ended(cluster) == "completed", cluster.admin_json("rollout", "status", "ro-order")
        slurm = cluster.start_slurm()
        env = cli_env(
            PATH=f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            TOPO_TUNE_CONTROLLER=cluster.controller_address,
            TOPO_TUNE_CONFIG_DIR=str(cluster.config_dir),
            SLURM_CONF=str(slurm.conf),
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
    job = box.sbatch(script, "--nodes=5")
    found = reports(job.output)
    assert (job.state, len(found)) == ("COMPLETED", 5), job.output
    assert hosts_by(found, "SLURM_PROCID") == ORDER
    assert {r["TOPO_TUNE_CONFIG_VERSION"] for r in found} == {box.version.id}
    # SLURM_NODEID keeps Slurm's own order (sorted names): only the ranks follow the version's.
    assert hosts_by(found, "SLURM_NODEID") == HOSTS


def test_a_subset_job_gets_the_order_re_planned_over_its_nodes(box: Box) -> None:
    script = f"topo-tune exec --launcher slurm -- srun {RANK_CMD}"
    job = box.sbatch(script, f"--nodelist={','.join(SUBSET)}")
    found = reports(job.output)
    assert (job.state, len(found)) == ("COMPLETED", 4), job.output
    assert hosts_by(found, "SLURM_PROCID") == SUBSET_ORDER
    assert {r["host"]: int(r["TOPO_TUNE_NODE_RANK"]) for r in found} == {h: SUBSET_ORDER.index(h) for h in SUBSET}
    assert {r["TOPO_TUNE_MASTER_ADDR"] for r in found} == {box.cluster.address("c")}, "node rank 0 is c"


def _torchrun_job(box: Box, *, tuned: bool) -> list[dict[str, str]]:
    """torchrun on every host at once, a 16 MiB all_reduce over gloo: in the version's order through
    ``exec --launcher torchrun``, or in the launcher's (node rank = the host's place among the sorted names)."""
    script = [str(REPORT), "--all-reduce-mib", "16", "--iters", "3"]
    job = "torchrun-tuned" if tuned else "torchrun-launcher"
    started = {}
    for index, host in enumerate(HOSTS):
        torchrun = ["torchrun", "--nproc_per_node=1", "--master_port=29500"]
        if tuned:
            exec_ = ["topo-tune", "exec", "--launcher", "torchrun", "--job-id", job, "--nodes", ",".join(HOSTS), "--"]
            argv = [*exec_, *torchrun, *script]
        else:
            placed = [f"--node_rank={index}", f"--nnodes={len(HOSTS)}", f"--master_addr={box.cluster.address('a')}"]
            argv = [*torchrun, *placed, *script]
        started[host] = subprocess.Popen(
            box.cluster.exec_argv(host, argv),
            env=box.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    outputs = {host: process.communicate(timeout=300) for host, process in started.items()}
    failed = {host: err[-2000:] for host, (_, err) in outputs.items() if started[host].returncode != 0}
    assert not failed, failed
    return reports("\n".join(out for out, _ in outputs.values()))


def test_torchrun_on_every_host_follows_the_order_and_its_all_reduce_is_twice_as_fast(box: Box) -> None:
    launcher = _torchrun_job(box, tuned=False)
    tuned = _torchrun_job(box, tuned=True)
    assert hosts_by(launcher, "torch_rank") == HOSTS
    assert hosts_by(tuned, "torch_rank") == ORDER
    assert hosts_by(tuned, "RANK") == ORDER
    seconds = {
        "launcher": max(float(r["all_reduce_s"]) for r in launcher),
        "tuned": max(float(r["all_reduce_s"]) for r in tuned),
    }
    # Two 100 Mbit/s links in the launcher's ring, none in the version's: 8x on paper.
    assert seconds["tuned"] * 2 <= seconds["launcher"], seconds


def test_salloc_from_the_login_host_without_an_agent(box: Box) -> None:
    argv = ["salloc", "--nodes=5", "topo-tune", "exec", "--launcher", "slurm", "--", "srun", *RANK_CMD.split()]
    done = box.run(HEAD, argv)
    assert ranked_hosts(done.stdout, "SLURM_PROCID", ok=done.returncode == 0, problem=done.stderr) == ORDER


def _mpirun(job: str, nodes: str) -> list[str]:
    """``exec --launcher mpi`` around mpirun, as docs/job-order.md writes it; every rank runs the inner exec."""
    passed = ["-x", "PATH", "-x", "TOPO_TUNE_CONTROLLER", "-x", "TOPO_TUNE_TOKEN", "-x", "TOPO_TUNE_CONFIG_DIR"]
    passed += ["-x", f"TOPO_TUNE_JOB_ID={job}", "-x", f"TOPO_TUNE_NODES={nodes}"]
    return ["topo-tune", "exec", "--launcher", "mpi", "--job-id", job, "--nodes", nodes, "--", "mpirun", *passed]


def test_mpirun_from_a_node_other_than_the_first(box: Box) -> None:
    done = box.run("c", [*_mpirun("mpi-from-c", ",".join(HOSTS)), "-np", "5", *RANK_CMD.split()])
    ok = done.returncode == 0
    assert ranked_hosts(done.stdout, "OMPI_COMM_WORLD_RANK", ok=ok, problem=done.stderr) == ORDER


def test_mpirun_inside_sbatch(box: Box) -> None:
    passed = "-x PATH -x TOPO_TUNE_CONTROLLER -x TOPO_TUNE_TOKEN -x TOPO_TUNE_CONFIG_DIR"
    script = f"topo-tune exec --launcher mpi -- mpirun {passed} -np 5 {RANK_CMD}"
    job = box.sbatch(script, "--nodes=5")
    assert ranked_hosts(job.output, "OMPI_COMM_WORLD_RANK", ok=job.state == "COMPLETED", problem=job.output) == ORDER


def test_a_host_list_after_a_two_word_mpirun_option_is_refused(box: Box) -> None:
    argv = [*_mpirun("mpi-two-words", ",".join(HOSTS)), "--mca", "btl", "self", "-H", "a,b", *RANK_CMD.split()]
    done = box.run("a", argv)
    assert done.returncode == 1 and "-H" in done.stderr and not reports(done.stdout), done.stderr[-3000:]


def test_a_config_directory_shared_by_every_agent(box: Box) -> None:
    """One config directory for all agents (as the README's demo, or NFS): host a's, mounted on every host."""
    cluster = box.cluster
    shared = cluster.workdir / "config-a"
    registrations = {name: int(str(node["registrations"])) for name, node in cluster.nodes().items()}
    try:
        for host in HOSTS[1:]:
            cluster.mount_on(host, shared, cluster.config_dir)
            cluster.agents[host].kill()
            cluster.start_agent(host)  # writes its name into the shared directory
        wait_until(
            lambda: all(
                (node["state"], int(str(node["registrations"]))) == ("ready", registrations[name] + 1)
                for name, node in cluster.nodes().items()
                if name != "a"
            ),
            timeout=120,
            interval=0.5,
            what="the agents back on the shared directory",
        )
        job = box.sbatch(f"topo-tune exec --launcher slurm -- srun {RANK_CMD}", "--nodes=5")
    finally:
        for host in HOSTS[1:]:
            cluster.unmount_on(host, cluster.config_dir)
    found = reports(job.output)
    assert (job.state, len(found)) == ("COMPLETED", 5), job.output
    assert hosts_by(found, "SLURM_PROCID") == ORDER
    assert {r["host"]: int(r["TOPO_TUNE_NODE_RANK"]) for r in found} == {h: ORDER.index(h) for h in HOSTS}


def test_a_job_id_slurm_hands_out_again_gets_an_order_of_its_own(box: Box) -> None:
    assert box.cluster.slurm is not None
    script = f"topo-tune exec --launcher slurm -- srun {RANK_CMD}"
    earlier = box.sbatch(script, "--nodes=5")
    assert earlier.state == "COMPLETED", earlier.output
    box.cluster.slurm.restart_slurmctld_afresh()  # job ids start over at 1
    submitted = 0
    while submitted + 1 < int(earlier.id):  # jobs of nothing, until the next id is the earlier job's
        submitted = int(box.sbatch("true", "--nodes=1", wait=False).id)
    again = box.sbatch(script, f"--nodelist={','.join(SUBSET)}")
    if again.id != earlier.id:  # the scenario did not happen: say so, not "wrong order"
        pytest.fail(f"Slurm gave job id {again.id}, not {earlier.id} again")
    ok = again.state == "COMPLETED"
    assert ranked_hosts(again.output, "SLURM_PROCID", ok=ok, problem=again.output, count=len(SUBSET)) == SUBSET_ORDER
