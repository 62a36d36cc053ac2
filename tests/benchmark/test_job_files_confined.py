"""A benchmark job cannot make the agent's workers write outside the job's own directory (real gloo workers).

torch's flight recorder on the gloo backend (torch 2.13, CPU) records collectives but neither dumps on a
timeout nor opens its pipe file: those are ProcessGroupNCCL's watchdog features. A gloo rank that timed out
with ``TORCH_FR_BUFFER_SIZE=16``, ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and both file variables set wrote nothing.
So what is shown here on gloo is the policy and the agent's rewriting: the paths the workers were really
given (their C environment, as the result records it) and the files that appeared anywhere watched.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.processes import free_port
from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor
from topo_tune.agent.config_store import ConfigStore
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import OUTPUT_DIR, VARIABLES, EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, plan_job
from topo_tune.errors import EnvPolicyError, ValidationError
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.nccl.value_types import InputFile, OutputFile
from topo_tune.v1 import agent_pb2
from topo_tune.versions.version import ConfigVersion, render_nccl_conf
from topo_tune.wire.benchmark import rank_result_from_proto, spec_to_proto

pytestmark = pytest.mark.slow

_PATH_KEYS = sorted(k for k, v in VARIABLES.items() if isinstance(v, InputFile | OutputFile))


def _spec(job_id: str, env: dict[str, str]) -> BenchmarkSpec:
    return plan_job(
        job_id=job_id,
        collective=Collective.ALL_REDUCE,
        sweep=SizeSweep(1024, 1024, 2),
        dtype=dtype_named("float32"),
        nodes=[JobNode("n0", "127.0.0.1", 1)],
        rendezvous_port=free_port(),
        env=env,
        gpu_devices=False,
        ranks_per_node=1,
        iters=2,
        warmup_iters=1,
    )


class Cluster:
    """One node's config store, plugin dir and benchmark work dir, and a sentinel directory outside them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "config"
        self.plugins = root / "plugins"
        self.work = root / "state" / "bench"
        self.outside = root / "outside"
        for d in (self.plugins, self.work, self.outside):
            d.mkdir(parents=True, exist_ok=True)
        self.store = ConfigStore(self.config)
        files = {"nccl.conf": render_nccl_conf({"NCCL_DEBUG": "WARN"})}
        self.version = ConfigVersion(files).id
        self.store.apply(self.version, files)
        self.policy = EnvPolicy(config_dirs=(self.config,), plugin_dirs=(self.plugins,))
        self.executor = BenchmarkExecutor(policy=self.policy)

    def run(self, job_id: str, env: dict[str, str]) -> agent_pb2.CommandResult:
        return self.executor.execute(
            spec_to_proto(_spec(job_id, env)),
            node_name="n0",
            backend=Backend.GLOO,
            deadline_s=60.0,
            work_dir=self.work,
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(tmp_path_factory.mktemp("confined"))


def _tree(roots: Iterable[Path], *, skip: Path | None = None) -> dict[str, str]:
    """Every entry under ``roots`` (not following links) with a digest of its content or its kind."""
    seen: dict[str, str] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            if skip is not None and Path(dirpath) == skip:
                dirnames[:] = []
                continue
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                if path.is_symlink():
                    seen[str(path)] = "link:" + os.readlink(path)
                elif path.is_file():
                    seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    seen[str(path)] = "dir" if path.is_dir() else "other"
    return seen


def _top_level(directory: Path) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


def test_flight_recorder_paths_from_a_job_are_refused_before_anything_runs(cluster: Cluster) -> None:
    victim = cluster.outside / "victim0.pipe"
    victim.write_text("regular file")
    env = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "16",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(cluster.outside / "victim"),
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(cluster.outside / "frdump_"),
        "TORCH_FR_DUMP_TEMP_FILE": "/etc/cron.d/x",
    }
    result = cluster.run("fr-refused", env)
    assert result.status == agent_pb2.COMMAND_STATUS_REJECTED
    for key in ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"):
        assert f"{key}: give a bare file name" in result.message
    assert victim.read_text() == "regular file"
    assert not (cluster.work / "fr-refused").exists()


def test_flight_recorder_files_a_job_names_are_given_to_the_workers_inside_its_directory(cluster: Cluster) -> None:
    env = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "16",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "victim",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "frdump_",
    }
    result = cluster.run("fr-confined", env)
    assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, result.message
    [rank] = [rank_result_from_proto(r) for r in result.node_benchmark.ranks]
    out = cluster.work / "fr-confined" / OUTPUT_DIR
    assert rank.effective_env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(out / "victim")
    assert rank.effective_env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(out / "frdump_")


def test_a_job_without_dump_settings_still_gets_torchs_dump_file_inside_its_directory(cluster: Cluster) -> None:
    # torch's own default is /tmp/nccl_trace_rank_<rank>, outside every job.
    result = cluster.run("fr-default", {"NCCL_DEBUG": "WARN"})
    assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, result.message
    started = (cluster.work / "fr-default" / "rank-0" / "progress.jsonl").read_text()
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in started and "TORCH_FR_DUMP_TEMP_FILE" in started


def test_nccl_debug_file_cannot_reach_the_config_directory(cluster: Cluster) -> None:
    target = cluster.config / "active" / "nccl.conf"
    before = target.read_text()
    for value in (str(target), "../../../config/active/nccl.conf", "active/nccl.conf"):
        result = cluster.run("debug-into-config", {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": value})
        assert result.status == agent_pb2.COMMAND_STATUS_REJECTED
        assert "NCCL_DEBUG_FILE: give a bare file name" in result.message
    # A bare name is written where the agent puts it: the job's output directory.
    result = cluster.run("debug-confined", {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "nccl.conf"})
    assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, result.message
    [rank] = [rank_result_from_proto(r) for r in result.node_benchmark.ranks]
    assert rank.effective_env["NCCL_DEBUG_FILE"] == str(cluster.work / "debug-confined" / OUTPUT_DIR / "nccl.conf")
    assert target.read_text() == before
    # Nor can a config version carry it to every job: refused at push, at gate and at apply alike.
    with pytest.raises(ValidationError, match=r"NCCL_DEBUG_FILE.*every job write a file"):
        ConfigVersion({"nccl.conf": "NCCL_DEBUG=WARN\nNCCL_DEBUG_FILE=x.log\n"})
    with pytest.raises(ValidationError, match=r"NCCL_TOPO_DUMP_FILE.*every job write a file"):
        cluster.store.apply("cv-0000000000000000", {"nccl.conf": "NCCL_TOPO_DUMP_FILE=t.xml\n"})


_ATTACKS = st.sampled_from(
    [
        "/etc/cron.d/x",
        "/var/tmp/victim",
        "../outside/x",
        "../../outside/x",
        "x/../../y",
        "victim",
        "frdump_",
        "nccl.%h.%p",
        "none",
        "16",
        "INFO",
    ]
)


@st.composite
def _job_env(draw: st.DrawFn, cluster_root: str) -> dict[str, str]:
    keys = draw(st.lists(st.sampled_from(_PATH_KEYS + sorted(VARIABLES)), min_size=1, max_size=8, unique=True))
    absolute = st.sampled_from(
        [
            f"{cluster_root}/outside/x",
            f"{cluster_root}/config/active/nccl.conf",
            f"{cluster_root}/config/../outside/x",
            f"{cluster_root}/state/bench/other-job/x",
        ]
    )
    return {key: draw(st.one_of(_ATTACKS, absolute)) for key in keys}


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_accepted_variable_set_makes_a_worker_write_outside_its_job_directory(
    cluster: Cluster, data: st.DataObject
) -> None:
    env = data.draw(_job_env(str(cluster.root)))
    try:
        cluster.policy.check(env)
        accepted = env
    except EnvPolicyError as error:
        refused = {v.key for v in error.violations}
        accepted = {k: v for k, v in env.items() if k not in refused}
    cluster.policy.check(accepted)
    job_id = "prop-" + hashlib.sha256(repr(sorted(accepted.items())).encode()).hexdigest()[:12]
    job_dir = cluster.work / job_id
    watched = [cluster.root, Path("/tmp"), Path("/var/tmp")]
    tree_before = _tree([cluster.root], skip=cluster.work)
    tops_before = {str(d): _top_level(d) for d in watched[1:]}

    result = cluster.run(job_id, accepted)

    assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, (accepted, result.message)
    [rank] = [rank_result_from_proto(r) for r in result.node_benchmark.ranks]
    for key, value in rank.effective_env.items():
        kind = VARIABLES.get(key)
        if isinstance(kind, OutputFile):
            assert Path(value).parent == job_dir / OUTPUT_DIR, (key, value)
        elif isinstance(kind, InputFile):
            assert Path(os.path.realpath(value)).is_relative_to(os.path.realpath(cluster.config)), (key, value)
    assert _tree([cluster.root], skip=cluster.work) == tree_before
    for directory, names in tops_before.items():
        appeared = _top_level(Path(directory)) - names
        assert not {n for n in appeared if "nccl_trace" in n or "victim" in n or "frdump" in n}, appeared
