"""Benchmark workers kept across jobs: real gloo worker processes on loopback, one executor per simulated node.

A job whose worker environment (tuner table path aside) matches a kept set's runs in those processes; anything
else, and anything after a failure, runs in fresh ones; the bounds (idle sets, idle time, memory) hold. A job of
the same membership (ranks, environment, table content) also reuses the kept communicator, when every rank kept
the same one; otherwise all ranks make a new one together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.benchmark.test_gloo_jobs import _run_job
from tests.benchmark.test_gloo_jobs import _spec as gloo_job
from tests.support.processes import process_gone
from tests.support.waiting import wait_until
from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor
from topo_tune.agent.bench.kept_communicator import communicator_key
from topo_tune.agent.bench.kept_workers import KeptWorkers, worker_set_key
from topo_tune.agent.bench.tuner_plugin import TunerPluginStage
from topo_tune.agent.bench.worker_config import WorkerConfig, WorkerFault
from topo_tune.agent.settings import AgentSettings
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.results import RankResult
from topo_tune.config.cluster import SearchConfig
from topo_tune.controller.benchmarks.plan import aggregate
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin.job_env import TABLE_ENV, WORKLOAD_ENV
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import rank_result_from_proto

pytestmark = pytest.mark.slow

TABLE = "allreduce,0,65536,-1,-1,16,1,2\n"


def _spec(
    job_id: str,
    *,
    nodes: Sequence[str] = ("n0",),
    ranks_per_node: int = 2,
    env: dict[str, str] | None = None,
    table: str = "",
) -> BenchmarkSpec:
    return gloo_job(
        job_id,
        collective=Collective.ALL_REDUCE,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        env=env,
        iters=3,
        tuner_table=table,
    )


def _succeeded(results: dict[str, agent_pb2.CommandResult]) -> list[RankResult]:
    for node, result in results.items():
        assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, (node, result.message)
    return [rank_result_from_proto(r) for res in results.values() for r in res.node_benchmark.ranks]


def _started(work: Path, spec: BenchmarkSpec) -> list[dict[str, int]]:
    """Each rank's first progress record (``pid``, ``jobs_before``), in rank order."""
    out = []
    for rank in range(spec.world_size):
        first = (work / spec.job_id / f"rank-{rank}" / "progress.jsonl").read_text().splitlines()[0]
        record = json.loads(first)
        out.append({"pid": int(record["pid"]), "jobs_before": int(record["jobs_before"])})
    return out


def _communicators(work: Path, spec: BenchmarkSpec) -> list[tuple[str, int]]:
    """Each rank's communicator for the job ("kept" or "new") and how many its process had made, in rank order."""
    out = []
    for rank in range(spec.world_size):
        lines = (work / spec.job_id / f"rank-{rank}" / "progress.jsonl").read_text().splitlines()
        joined = next(r for r in map(json.loads, lines) if r["phase"] == "joined")
        out.append((str(joined["communicator"]), int(joined["communicators_made"])))
    return out


def _first_pid(rank_dir: Path) -> int:
    return int(json.loads((rank_dir / "progress.jsonl").read_text().splitlines()[0])["pid"])


def _pids(work: Path, spec: BenchmarkSpec) -> list[int]:
    return [r["pid"] for r in _started(work, spec)]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def executor() -> Iterator[BenchmarkExecutor]:
    one = BenchmarkExecutor(policy=EnvPolicy(), kept_worker_sets=1)
    yield one
    one.stop()


def test_a_job_of_the_same_environment_runs_in_the_kept_workers_with_fresh_results(
    executor: BenchmarkExecutor, tmp_path: Path
) -> None:
    nodes = {"n0": executor}
    first = _spec("same-1")
    first_results = _succeeded(_run_job(nodes, first, tmp_path))
    second = _spec("same-2")
    second_results = _succeeded(_run_job(nodes, second, tmp_path))

    assert _pids(tmp_path, second) == _pids(tmp_path, first)
    assert [r["jobs_before"] for r in _started(tmp_path, second)] == [1, 1]
    # The same measurement as a fresh worker's: every size checked and correct, the same environment recorded.
    for spec, results in ((first, first_results), (second, second_results)):
        rows = aggregate(spec, results)
        assert {m.bytes for m in rows} == {4096, 65536}
        assert all(m.checked and m.wrong == 0 and m.time_us > 0 for m in rows)
    assert [r.effective_env for r in second_results] == [r.effective_env for r in first_results]
    # Nothing of a job stays in its kept processes: rank 0 closed the job's rendezvous store, nothing listens on
    # its port (SO_REUSEADDR, as the store itself binds: the closed connections may sit in TIME_WAIT).
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((first.rendezvous_host, first.rendezvous_port))
        s.listen()
    # Each job's output is its own: the second job's stderr file is the second job's, not appended to the first's.
    assert all((tmp_path / "same-2" / f"rank-{r}" / "stderr.log").exists() for r in range(2))

    # A different environment starts fresh processes; with one idle set allowed, the first set is evicted.
    other = _spec("other-1", env={"NCCL_DEBUG": "WARN", "TORCH_DISTRIBUTED_DEBUG": "INFO"})
    _succeeded(_run_job(nodes, other, tmp_path))
    assert set(_pids(tmp_path, other)).isdisjoint(_pids(tmp_path, first))
    assert [r["jobs_before"] for r in _started(tmp_path, other)] == [0, 0]
    kept = executor.kept(Backend.GLOO)
    assert kept is not None and len(kept.idle_keys()) == 1
    wait_until(lambda: all(_gone(p) for p in _pids(tmp_path, first)), what="the evicted set's processes to end")

    # The agent stops: its kept workers end with it.
    executor.stop()
    wait_until(lambda: all(_gone(p) for p in _pids(tmp_path, other)), what="the kept workers to end at stop")


def test_a_failed_or_timed_out_job_never_leaves_its_workers_for_the_next(
    executor: BenchmarkExecutor, tmp_path: Path
) -> None:
    nodes = {"n0": executor}
    kept = _spec("kept-1")
    _succeeded(_run_job(nodes, kept, tmp_path))

    # A kept worker killed while idle: the next job of its key notices and starts a fresh set.
    victim = _pids(tmp_path, kept)[1]
    os.kill(victim, signal.SIGKILL)
    # Exited (every thread of it, not only the leader): a zombie or reaped by the fork server, its parent.
    wait_until(lambda: process_gone(victim), what="its death")
    after_kill = _spec("after-kill")
    _succeeded(_run_job(nodes, after_kill, tmp_path))
    assert set(_pids(tmp_path, after_kill)).isdisjoint(_pids(tmp_path, kept))

    # A rank of a kept set that hangs: bounded by the deadline, and the next job gets fresh workers.
    hung = _spec("hung-1")
    results = _run_job(nodes, hung, tmp_path, deadline_s=10.0, fault=WorkerFault(hang_before_join_rank=1))
    assert results["n0"].status == agent_pb2.COMMAND_STATUS_TIMED_OUT, results["n0"].message
    assert _pids(tmp_path, hung) == _pids(tmp_path, after_kill)  # it did run in the kept set
    assert all(_gone(p) for p in _pids(tmp_path, hung))
    after_hang = _spec("after-hang")
    _succeeded(_run_job(nodes, after_hang, tmp_path))
    assert [r["jobs_before"] for r in _started(tmp_path, after_hang)] == [0, 0]

    # A wrong result fails the job, and its workers are not kept either.
    wrong = _spec("wrong-1")
    results = _run_job(nodes, wrong, tmp_path, fault=WorkerFault(corrupt_rank=0))
    assert results["n0"].status == agent_pb2.COMMAND_STATUS_FAILED and "wrong elements" in results["n0"].message
    after_wrong = _spec("after-wrong")
    _succeeded(_run_job(nodes, after_wrong, tmp_path))
    assert set(_pids(tmp_path, after_wrong)).isdisjoint(_pids(tmp_path, wrong))


def test_ranks_on_a_restarted_agent_meet_kept_ranks_elsewhere(tmp_path: Path) -> None:
    """Whether a node's workers were kept is that node's business: every job makes its own rendezvous, and a
    communicator only one node kept is replaced, on both, by a new one."""
    executors = {n: BenchmarkExecutor(policy=EnvPolicy(), kept_worker_sets=2) for n in ("n0", "n1")}
    try:
        first = _spec("two-1", nodes=("n0", "n1"), ranks_per_node=1)
        _succeeded(_run_job(executors, first, tmp_path))
        executors["n1"].stop()  # n1's agent restarts: its workers are gone, n0 still holds its kept one
        executors["n1"] = BenchmarkExecutor(policy=EnvPolicy(), kept_worker_sets=2)
        second = _spec("two-2", nodes=("n0", "n1"), ranks_per_node=1)
        results = _succeeded(_run_job(executors, second, tmp_path))
        assert all(m.wrong == 0 for m in aggregate(second, results))
        before, after = _started(tmp_path, first), _started(tmp_path, second)
        assert after[0] == {"pid": before[0]["pid"], "jobs_before": 1}  # n0's rank 0: kept
        assert after[1]["pid"] != before[1]["pid"] and after[1]["jobs_before"] == 0  # n1's rank 1: fresh
        # n0 kept the first job's communicator, n1 lost it: both made a new one, and the next job keeps that.
        assert _communicators(tmp_path, second) == [("new", 2), ("new", 1)]
        third = _spec("two-3", nodes=("n0", "n1"), ranks_per_node=1)
        results = _succeeded(_run_job(executors, third, tmp_path))
        assert all(m.wrong == 0 for m in aggregate(third, results))
        assert _communicators(tmp_path, third) == [("kept", 2), ("kept", 1)]
    finally:
        for one in executors.values():
            one.stop()


def test_a_job_of_the_same_membership_reuses_the_communicator_another_table_or_rank_map_makes_a_new_one(
    tmp_path: Path,
) -> None:
    stage = TunerPluginStage(installed_dirs=(), build_dir=tmp_path / "plugin", table_dir=tmp_path / "tables")
    policy = EnvPolicy(config_dirs=(stage.table_dir,), plugin_dirs=stage.plugin_dirs)
    executor = BenchmarkExecutor(policy=policy, tuner_plugin=stage, kept_worker_sets=1)
    work = tmp_path / "work"
    try:
        nodes = {"n0": executor}
        same = [_spec(f"same-{i}", table=TABLE) for i in range(3)]
        swapped = _spec("swapped", table=TABLE)
        # Rank 0 on the node's second local slot and rank 1 on its first: the same processes, another rank map.
        swapped = dataclasses.replace(
            swapped, ranks=tuple(dataclasses.replace(s, local_rank=1 - s.local_rank) for s in swapped.ranks)
        )
        jobs = [*same[:2], _spec("other-table", table=TABLE.replace(",16,", ",8,")), same[2], swapped]
        results = {spec.job_id: _succeeded(_run_job(nodes, spec, work)) for spec in jobs}

        assert len({tuple(_pids(work, spec)) for spec in jobs[:4]}) == 1  # one set of processes ran the four
        assert _communicators(work, same[0]) == [("new", 1)] * 2
        assert _communicators(work, same[1]) == [("kept", 1)] * 2  # the same table's content, another file
        assert _communicators(work, jobs[2]) == [("new", 2)] * 2  # another table: NCCL reads it per communicator
        assert _communicators(work, same[2]) == [("new", 3)] * 2  # back to the first table: new again
        assert _pids(work, swapped) == list(reversed(_pids(work, same[2])))
        assert _communicators(work, swapped) == [("new", 4)] * 2  # another rank map
        # A kept communicator measures as a new one does: every size checked and right.
        for spec in jobs:
            rows = aggregate(spec, results[spec.job_id])
            assert {m.bytes for m in rows} == {4096, 65536}
            assert all(m.checked and m.wrong == 0 and m.time_us > 0 for m in rows)
    finally:
        executor.stop()


@pytest.mark.parametrize("why", ["switched off", "workload counts"])
def test_kept_communicators_off_or_counting_keeps_the_workers_but_makes_a_communicator_a_job(
    tmp_path: Path, why: str
) -> None:
    if why == "switched off":
        executor = BenchmarkExecutor(policy=EnvPolicy(), kept_worker_sets=1, kept_communicators=False)
    else:
        # The plugin writes a communicator's call counts when it is destroyed: kept, they would sum two jobs.
        counts = {WORKLOAD_ENV: str(tmp_path / "workload")}
        executor = BenchmarkExecutor(policy=EnvPolicy(), kept_worker_sets=1, passthrough=counts)
    try:
        specs = [_spec(f"off-{i}") for i in range(2)]
        for spec in specs:
            _succeeded(_run_job({"n0": executor}, spec, tmp_path))
        assert _pids(tmp_path, specs[1]) == _pids(tmp_path, specs[0])
        assert _communicators(tmp_path, specs[1]) == [("new", 2)] * 2
    finally:
        executor.stop()


def test_a_table_only_change_reuses_the_workers_and_each_job_reads_its_own_table(tmp_path: Path) -> None:
    # gloo never loads the plugin; what matters is the table each job's process is told to read.
    stage = TunerPluginStage(installed_dirs=(), build_dir=tmp_path / "plugin", table_dir=tmp_path / "tables")
    policy = EnvPolicy(config_dirs=(stage.table_dir,), plugin_dirs=stage.plugin_dirs)
    executor = BenchmarkExecutor(policy=policy, tuner_plugin=stage, kept_worker_sets=1)
    try:
        nodes = {"n0": executor}
        tables = {"table-a": TABLE, "table-b": TABLE.replace(",16,", ",8,")}
        work = tmp_path / "work"
        results = {job: _succeeded(_run_job(nodes, _spec(job, table=t), work)) for job, t in tables.items()}
        assert _pids(tmp_path / "work", _spec("table-b")) == _pids(tmp_path / "work", _spec("table-a"))
        for job, table in tables.items():
            digest = hashlib.sha256(table.encode()).hexdigest()
            assert {r.effective_env["topo_tune.tuner_table_sha256"] for r in results[job]} == {digest}
    finally:
        executor.stop()


def test_idle_sets_end_after_the_idle_time_and_big_workers_are_not_kept(tmp_path: Path) -> None:
    quick = BenchmarkExecutor(policy=EnvPolicy(), kept_worker_sets=2, kept_idle_s=0.5)
    small = BenchmarkExecutor(policy=EnvPolicy(), kept_worker_sets=2, kept_max_rss_bytes=1 << 20)
    try:
        idle = _spec("idle-1")
        _succeeded(_run_job({"n0": quick}, idle, tmp_path))
        wait_until(lambda: all(_gone(p) for p in _pids(tmp_path, idle)), what="the idle set to end")
        kept = quick.kept(Backend.GLOO)
        assert kept is not None and kept.idle_keys() == []

        big = _spec("big-1")
        _succeeded(_run_job({"n0": small}, big, tmp_path))
        small_kept = small.kept(Backend.GLOO)
        assert small_kept is not None and small_kept.idle_keys() == []  # every worker holds more than 1 MiB
        assert all(_gone(p) for p in _pids(tmp_path, big))
    finally:
        quick.stop()
        small.stop()


def test_on_gloo_jobs_that_differ_in_nccl_variables_share_workers_and_each_sees_only_its_own(
    executor: BenchmarkExecutor, tmp_path: Path
) -> None:
    # A search on gloo varies NCCL's variables per trial; gloo reads none of them, so the workers stay.
    nodes = {"n0": executor}
    first = _spec("nccl-a", env={"NCCL_DEBUG": "WARN", "NCCL_ALGO": "Ring"})
    first_results = _succeeded(_run_job(nodes, first, tmp_path))
    second = _spec("nccl-b", env={"NCCL_DEBUG": "INFO", "NCCL_MIN_NCHANNELS": "4"})
    second_results = _succeeded(_run_job(nodes, second, tmp_path))

    assert _pids(tmp_path, second) == _pids(tmp_path, first)
    assert [r["jobs_before"] for r in _started(tmp_path, second)] == [1, 1]
    for results, want in ((first_results, first.env), (second_results, second.env)):
        for rank in results:
            seen = {k: v for k, v in rank.effective_env.items() if k.startswith("NCCL_")}
            assert seen == want, "each job's process environment holds exactly its own NCCL variables"


def test_by_default_a_proof_rotating_over_the_baseline_and_every_finalist_keeps_each_set(tmp_path: Path) -> None:
    # The proof sends each A/B pair as one job of two specs, and its pairs rotate: the baseline against finalist
    # 1, 2, 3, then 1 again. Each spec's set must be found by the next pair's job (seen on the GPU: the second
    # spec's set lived under its job's directory, so every pair started it afresh), and with fewer idle sets
    # kept than the working set, least-recently-used eviction kills the set the next pair needs.
    finalists = SearchConfig().finalists
    assert AgentSettings.kept_worker_sets >= 1 + finalists
    executor = BenchmarkExecutor(policy=EnvPolicy(), kept_worker_sets=AgentSettings.kept_worker_sets)
    envs = [{}, *({"TORCH_DISTRIBUTED_DEBUG": v} for v in ("OFF", "INFO", "DETAIL")[:finalists])]
    try:
        nodes = {"n0": executor}
        first: dict[int, list[int]] = {}
        for round_ in range(2):
            for index in range(1, len(envs)):
                job_id = f"proof-{round_}-{index}"
                pair = dataclasses.replace(
                    _spec(job_id, env=dict(envs[0])), next_specs=(_spec(job_id, env=dict(envs[index])),)
                )
                _succeeded(_run_job(nodes, pair, tmp_path))
                for arm, job_dir in ((0, job_id), (index, f"{job_id}.1")):  # the second spec's ranks: <job>.1/
                    pids = [_first_pid(tmp_path / job_dir / f"rank-{rank}") for rank in range(pair.world_size)]
                    assert first.setdefault(arm, pids) == pids, f"round {round_}: environment {arm} ran in a fresh set"
    finally:
        executor.stop()


def test_kept_workers_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="max_sets"):
        KeptWorkers(max_sets=-1)
    with pytest.raises(ValueError, match="idle_s"):
        KeptWorkers(idle_s=0)


def test_the_key_ignores_only_the_tuner_table_path() -> None:
    def key(env: dict[str, str], *, devices: tuple[int, ...] = (0, 1), bind: str = "127.0.0.1") -> str:
        return worker_set_key(
            env=env, backend=Backend.NCCL, bind_address=bind, devices=devices, cpus=[(), ()], python="python3"
        )

    base = {"NCCL_DEBUG": "WARN", "NCCL_TUNER_PLUGIN": "/lib/p.so", "NCCL_TUNER_CONFIG_FILE": "/t/job-1.csv"}
    assert key(base) == key({**base, "NCCL_TUNER_CONFIG_FILE": "/t/job-2.csv"})  # read per communicator
    assert key(base) != key({k: v for k, v in base.items() if k != "NCCL_TUNER_CONFIG_FILE"})
    assert key(base) != key({**base, "NCCL_ALGO": "Ring"})  # read once per process
    assert key(base) != key(base, devices=(1, 0))
    assert key(base) != key(base, bind="10.0.0.2")


def test_on_gloo_the_key_ignores_every_nccl_variable_and_nothing_else() -> None:
    def key(env: dict[str, str], backend: Backend = Backend.GLOO) -> str:
        return worker_set_key(env=env, backend=backend, bind_address="127.0.0.1", devices=(-1,), cpus=[()], python="p")

    base = {"NCCL_DEBUG": "WARN", "TORCH_DISTRIBUTED_DEBUG": "OFF"}
    assert key(base) == key({**base, "NCCL_ALGO": "Ring"}) == key({"TORCH_DISTRIBUTED_DEBUG": "OFF"})
    assert key(base) == key({**base, "NCCL_TUNER_CONFIG_FILE": "/t/job-1.csv"})  # a table: nothing gloo reads
    assert key(base) != key({**base, "TORCH_DISTRIBUTED_DEBUG": "INFO"})  # torch reads it
    assert key(base, Backend.NCCL) != key({**base, "NCCL_ALGO": "Ring"}, Backend.NCCL)  # NCCL reads it once


def test_the_communicator_key_holds_the_membership_and_the_tables_content_not_its_path(tmp_path: Path) -> None:
    tables = {name: tmp_path / f"{name}.csv" for name in ("a", "a-again", "b")}
    tables["a"].write_text(TABLE)
    tables["a-again"].write_text(TABLE)
    tables["b"].write_text(TABLE.replace(",16,", ",8,"))

    def key(spec: BenchmarkSpec, table: str = "a") -> str:
        config = WorkerConfig(
            spec=spec, rank=0, device=-1, backend=Backend.GLOO, bind_address="127.0.0.1", rendezvous_timeout_s=60,
            progress_path=tmp_path / "p", result_path=tmp_path / "r", stderr_path=tmp_path / "e", sys_path=(),
        )  # fmt: skip
        return communicator_key(config, {TABLE_ENV: str(tables[table])})

    base = _spec("k-1", nodes=("n0", "n1"), ranks_per_node=1)
    assert key(base) == key(_spec("k-2", nodes=("n0", "n1"), ranks_per_node=1))  # job id and port aside
    assert key(base) == key(base, "a-again")  # the same table in another file: the same communicator
    assert key(base) != key(base, "b")  # NCCL's plugin reads the table when a communicator is made
    swapped = dataclasses.replace(base, ranks=tuple(dataclasses.replace(s, rank=1 - s.rank) for s in base.ranks))
    assert key(base) != key(swapped)  # another rank map
    assert key(base) != key(_spec("k-3", nodes=("n0", "n2"), ranks_per_node=1))  # another peer
    assert key(base) != key(dataclasses.replace(base, env={"NCCL_DEBUG": "INFO"}))
