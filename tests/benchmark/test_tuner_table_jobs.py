"""Benchmark jobs carrying a candidate tuner table: staged by each agent, reaching every rank, refused when bad.

Real gloo workers on loopback, one executor per node as on separate agents. gloo never loads the plugin,
but the workers' environment and the staged files are exactly what NCCL would be handed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.benchmark.test_gloo_jobs import _on_nodes
from tests.support.processes import free_port
from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor
from topo_tune.agent.bench.tuner_plugin import TunerPluginStage
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, plan_job
from topo_tune.errors import SpecError
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin import LIBRARY_FILE, build_plugin
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import rank_result_from_proto, spec_to_proto

pytestmark = pytest.mark.slow

NODES = ("n0", "n1")
TABLE = """\
# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff
allreduce,0,65536,-1,-1,16,2,2
allreduce,65537,4294967296,ring,simple,4,2,2
"""


def _spec(job_id: str, *, table: str, env: dict[str, str] | None = None) -> BenchmarkSpec:
    return plan_job(
        job_id=job_id,
        collective=Collective.ALL_REDUCE,
        sweep=SizeSweep(1024, 131072, 128),
        dtype=dtype_named("float32"),
        nodes=[JobNode(n, "127.0.0.1", 1) for n in NODES],
        rendezvous_port=free_port(),
        env=env if env is not None else {"NCCL_DEBUG": "WARN"},
        gpu_devices=False,
        iters=3,
        warmup_iters=1,
        tuner_table=table,
    )


def _executor(root: Path, installed: Path | None = None) -> BenchmarkExecutor:
    stage = TunerPluginStage(
        installed_dirs=(installed,) if installed else (),
        build_dir=root / "plugin",
        table_dir=root / "tuner-tables",
    )
    policy = EnvPolicy(config_dirs=(root / "config", stage.table_dir), plugin_dirs=stage.plugin_dirs)
    return BenchmarkExecutor(policy=policy, tuner_plugin=stage)


def _run(
    executors: dict[str, BenchmarkExecutor], run: agent_pb2.RunBenchmark, work: Path
) -> dict[str, agent_pb2.CommandResult]:
    return _on_nodes(
        NODES,
        lambda n: executors[n].execute(run, node_name=n, backend=Backend.GLOO, deadline_s=60.0, work_dir=work / n),
    )


def test_every_rank_runs_with_the_agents_plugin_and_its_staged_copy_of_the_table(tmp_path: Path) -> None:
    installed = build_plugin(tmp_path / "image-lib").path.parent  # n1's image ships the library; n0 builds one
    executors = {"n0": _executor(tmp_path / "n0"), "n1": _executor(tmp_path / "n1", installed)}
    spec = _spec("table-1", table=TABLE)

    results = _run(executors, spec_to_proto(spec), tmp_path / "work")

    assert all(r.status == agent_pb2.COMMAND_STATUS_SUCCEEDED for r in results.values()), results
    by_node = {n: [rank_result_from_proto(x) for x in r.node_benchmark.ranks] for n, r in results.items()}
    digest = hashlib.sha256(TABLE.encode()).hexdigest()
    for node, expected_library in (
        ("n0", tmp_path / "n0" / "plugin" / LIBRARY_FILE),
        ("n1", installed / LIBRARY_FILE),
    ):
        [rank] = by_node[node]
        staged = tmp_path / node / "tuner-tables" / "table-1.csv"
        assert staged.read_text() == TABLE
        assert rank.effective_env["NCCL_TUNER_CONFIG_FILE"] == str(staged.resolve())
        assert rank.effective_env["NCCL_TUNER_PLUGIN"] == str(expected_library.resolve())
        assert rank.effective_env["topo_tune.tuner_table_sha256"] == digest, "every rank read the same table"
        assert rank.effective_env["NCCL_DEBUG"] == "WARN", "the job's own variables still arrive"
    assert expected_library.is_file()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("allreduce,0,1024,ring,ll64,4,-1,-1\n", "tuner_table line 1: protocol 'll64' is not one of ll, ll128, simple"),
        ("# ok\nallreduce,0,1024,-1,simple,4,-1,-1\n", "tuner_table line 2: algorithm '-1' and protocol 'simple'"),
        ("allreduce,0,1024,ring,simple,4,-1\n", "tuner_table line 1: expected 8 to 10 comma-separated fields, got 7"),
    ],
)
def test_a_malformed_table_is_refused_naming_line_and_field(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _spec("bad-1", table=table)  # the controller plans no such job
    run = spec_to_proto(_spec("bad-1", table=TABLE))
    run.tuner_table = table  # a controller that did not check: every agent refuses it before anything runs

    results = _run({n: _executor(tmp_path / n) for n in NODES}, run, tmp_path / "work")

    for node, result in results.items():
        assert result.status == agent_pb2.COMMAND_STATUS_REJECTED
        assert message in result.message
        assert not (tmp_path / node / "tuner-tables").exists(), "nothing is staged for a refused table"


def test_a_job_may_not_point_nccl_at_another_plugin_or_table_itself(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"env\.NCCL_TUNER_PLUGIN is set by the agent for a job with a tuner_table"):
        _spec("own-1", table=TABLE, env={"NCCL_TUNER_PLUGIN": str(tmp_path / "evil.so")})
    with pytest.raises(SpecError, match=r"env\.NCCL_TUNER_CONFIG_FILE is set by the agent"):
        _spec("own-2", table=TABLE, env={"NCCL_TUNER_CONFIG_FILE": str(tmp_path / "other.csv")})


def test_an_agent_without_a_tuner_plugin_refuses_a_table(tmp_path: Path) -> None:
    run = spec_to_proto(_spec("none-1", table=TABLE))
    result = BenchmarkExecutor(policy=EnvPolicy()).execute(
        run, node_name="n0", backend=Backend.GLOO, deadline_s=10.0, work_dir=tmp_path
    )
    assert result.status == agent_pb2.COMMAND_STATUS_REJECTED
    assert result.message == "tuner_table: this agent runs no tuner plugin"
