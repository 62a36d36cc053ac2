"""Real gloo benchmark jobs: one executor per simulated node, real worker processes on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.processes import free_port
from tests.support.waiting import wait_until
from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor, probe_figures
from topo_tune.agent.bench.launcher import BASE_ENV, DUMP_DEFAULTS
from topo_tune.agent.bench.worker_config import WorkerFault
from topo_tune.agent.command_executor import CommandExecutor
from topo_tune.agent.journal import Journal
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, aggregate, plan_job
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import rank_result_from_proto, spec_to_proto

pytestmark = pytest.mark.slow

NODES = ("n0", "n1", "n2")
SMALL_SWEEP = SizeSweep(4096, 65536, 16)


def _spec(
    job_id: str,
    *,
    collective: Collective = Collective.ALL_GATHER,
    sweep: SizeSweep = SMALL_SWEEP,
    nodes: Sequence[str] = NODES,
    ranks_per_node: int = 1,
    env: dict[str, str] | None = None,
    iters: int = 5,
    warmup_iters: int = 1,
    tuner_table: str = "",
) -> BenchmarkSpec:
    return plan_job(
        job_id=job_id,
        collective=collective,
        sweep=sweep,
        dtype=dtype_named("float32"),
        nodes=[JobNode(n, "127.0.0.1", ranks_per_node) for n in nodes],
        rendezvous_port=free_port(),
        env=env if env is not None else {"NCCL_DEBUG": "WARN"},
        gpu_devices=False,
        ranks_per_node=ranks_per_node,
        iters=iters,
        warmup_iters=warmup_iters,
        tuner_table=tuner_table,
    )


@pytest.fixture(scope="module")
def executors() -> dict[str, BenchmarkExecutor]:
    """One executor per node, kept across tests: a later job must still run on them."""
    return {n: BenchmarkExecutor(policy=EnvPolicy()) for n in NODES}


def _run_job(
    executors: dict[str, BenchmarkExecutor],
    spec: BenchmarkSpec,
    work_dir: Path,
    *,
    deadline_s: float = 60.0,
    fault: WorkerFault | None = None,
) -> dict[str, agent_pb2.CommandResult]:
    nodes = sorted({s.node_name for s in spec.ranks})
    run = spec_to_proto(spec)
    return _on_nodes(
        nodes,
        lambda n: executors[n].execute(
            run,
            node_name=n,
            backend=Backend.GLOO,
            deadline_s=deadline_s,
            work_dir=work_dir,
            fault=fault,
        ),
    )


def _on_nodes(
    nodes: Sequence[str], call: Callable[[str], agent_pb2.CommandResult]
) -> dict[str, agent_pb2.CommandResult]:
    """Call every node's executor at once, as the controller's commands would reach the agents."""
    with ThreadPoolExecutor(len(nodes)) as pool:
        futures = {n: pool.submit(call, n) for n in nodes}
        return {n: f.result() for n, f in futures.items()}


def _started_records(work_dir: Path, spec: BenchmarkSpec) -> list[dict[str, object]]:
    records = []
    for rank in range(spec.world_size):
        lines = (work_dir / spec.job_id / f"rank-{rank}" / "progress.jsonl").read_text().splitlines()
        records.append(json.loads(lines[0]))
    return records


def test_job_over_three_agents_is_correct_and_sees_only_its_env(
    executors: dict[str, BenchmarkExecutor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOPO_TUNE_AGENT_SECRET", "must-not-leak")
    monkeypatch.setenv("LD_PRELOAD", "")
    env = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    spec = _spec("ok-1", env=env)
    results = _run_job(executors, spec, tmp_path)

    for node, result in results.items():
        assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, (node, result.message)
        assert [s.outcome for s in result.node_benchmark.rank_status] == [agent_pb2.RANK_OUTCOME_FINISHED]
    rank_results = [rank_result_from_proto(r) for res in results.values() for r in res.node_benchmark.ranks]
    rows = aggregate(spec, rank_results)
    # all_gather runs both placements; every row was checked and correct.
    # 4096 B = 1024 floats; 1024 // 3 = 341 rounds down to 340 per rank: 340 * 3 * 4 = 4080 B.
    assert {(m.bytes, m.in_place) for m in rows} == {
        (4080, False),
        (4080, True),
        (65520, False),
        (65520, True),
    }
    assert all(m.checked and m.wrong == 0 and m.time_us > 0 and m.busbw_gbps > 0 for m in rows)
    assert all(r.effective_env["NCCL_DEBUG"] == "WARN" for r in rank_results)

    # Environment isolation: exactly the base plus the job's variables, identical on every rank.
    started = _started_records(tmp_path, spec)
    expected_keys = sorted({*BASE_ENV, *DUMP_DEFAULTS, "HOME", "TMPDIR", *env})
    assert all(rec["env_keys"] == expected_keys for rec in started)
    assert len({rec["env_digest"] for rec in started}) == 1


def test_a_forced_wrong_result_fails_the_job(executors: dict[str, BenchmarkExecutor], tmp_path: Path) -> None:
    spec = _spec("wrong-1", collective=Collective.REDUCE_SCATTER)
    results = _run_job(executors, spec, tmp_path, fault=WorkerFault(corrupt_rank=1))
    assert results["n1"].status == agent_pb2.COMMAND_STATUS_FAILED
    assert "wrong elements" in results["n1"].message
    assert results["n0"].status == agent_pb2.COMMAND_STATUS_SUCCEEDED
    rows = aggregate(spec, [rank_result_from_proto(r) for res in results.values() for r in res.node_benchmark.ranks])
    assert all(m.wrong == 1 for m in rows)  # one altered element per size and placement


def test_a_rank_that_never_joins_is_killed_and_the_next_job_runs(
    executors: dict[str, BenchmarkExecutor], tmp_path: Path
) -> None:
    # The deadline must leave the live ranks time to reach the rendezvous, or they are missing too: three times
    # what a whole job takes now (workers' torch imports included), measured in this test, since a 2-core machine
    # busy with other tests takes many times longer than an idle one.
    started_at = time.monotonic()
    before = _run_job(executors, _spec("before-hang"), tmp_path)
    assert all(r.status == agent_pb2.COMMAND_STATUS_SUCCEEDED for r in before.values())
    deadline_s = max(12.0, 3 * (time.monotonic() - started_at))
    spec = _spec("hang-1")
    results = _run_job(executors, spec, tmp_path, deadline_s=deadline_s, fault=WorkerFault(hang_before_join_rank=2))
    for node, result in results.items():
        assert result.status == agent_pb2.COMMAND_STATUS_TIMED_OUT, (node, result.message)
        (status,) = result.node_benchmark.rank_status
        assert status.outcome == agent_pb2.RANK_OUTCOME_HUNG and not status.joined
    hung = results["n2"].node_benchmark.rank_status[0]
    assert hung.phase == "started"
    for node in ("n0", "n1"):
        status = results[node].node_benchmark.rank_status[0]
        assert status.phase == "rendezvous" and list(status.waiting_for) == [2], status
    for result in results.values():
        assert "missing at the rendezvous: [2]" in result.message
    # Killed with their process groups: no worker of the hung job is left.
    for rank in range(3):
        pid = _started_records(tmp_path, spec)[rank]["pid"]
        with pytest.raises(ProcessLookupError):
            os.kill(int(str(pid)), 0)

    again = _run_job(executors, _spec("after-hang"), tmp_path)
    assert all(r.status == agent_pb2.COMMAND_STATUS_SUCCEEDED for r in again.values())


def test_a_refused_env_is_rejected_before_anything_runs(
    executors: dict[str, BenchmarkExecutor], tmp_path: Path
) -> None:
    spec = _spec("refused-1", env={"LD_PRELOAD": "/tmp/x.so", "NCCL_PROTO": "LL128"})
    result = executors["n0"].execute(
        spec_to_proto(spec), node_name="n0", backend=Backend.GLOO, deadline_s=30, work_dir=tmp_path
    )
    assert result.status == agent_pb2.COMMAND_STATUS_REJECTED
    assert "LD_PRELOAD" in result.message and "NCCL_PROTO" in result.message
    assert not (tmp_path / "refused-1").exists()


def _two_specs(job_id: str, *, second_env: dict[str, str] | None = None) -> BenchmarkSpec:
    """all_gather in rank order n0 n1 n2, then reduce_scatter in order n2 n0 n1: one job."""
    first = _spec(job_id)
    second = _spec(job_id, collective=Collective.REDUCE_SCATTER, nodes=("n2", "n0", "n1"), env=second_env)
    return dataclasses.replace(first, next_specs=(second,))


def test_a_job_of_two_specs_runs_each_with_its_own_collective_and_rank_map(
    executors: dict[str, BenchmarkExecutor], tmp_path: Path
) -> None:
    spec = _two_specs("specs-1")
    results = _run_job(executors, spec, tmp_path)
    for node, result in results.items():
        assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, (node, result.message)
        assert "2 specs run" in result.message
    ranks = [rank_result_from_proto(r) for res in results.values() for r in res.node_benchmark.ranks]
    # n2 holds rank 2 in the first spec and rank 0 in the second (its own launch, the rendezvous on it).
    n2 = sorted((r.sizes[0].spec, r.rank) for r in map(rank_result_from_proto, results["n2"].node_benchmark.ranks))
    assert n2 == [(0, 2), (1, 0)]
    rows = aggregate(spec, ranks)
    by_spec = {i: {(m.bytes, m.in_place) for m in rows if m.spec == i} for i in (0, 1)}
    # all_gather: 4096 B -> 4080 B over 3 ranks (as above); reduce_scatter reports the same rounding.
    assert by_spec[0] == {(4080, False), (4080, True), (65520, False), (65520, True)}
    assert by_spec[1] == by_spec[0]
    assert all(m.checked and m.wrong == 0 and m.time_us > 0 for m in rows), "every spec's data checked and right"


def test_a_refused_env_in_a_later_spec_rejects_the_whole_job_before_anything_runs(
    executors: dict[str, BenchmarkExecutor], tmp_path: Path
) -> None:
    spec = _two_specs("specs-refused", second_env={"LD_PRELOAD": "/tmp/x.so"})
    result = executors["n0"].execute(
        spec_to_proto(spec), node_name="n0", backend=Backend.GLOO, deadline_s=30, work_dir=tmp_path
    )
    assert result.status == agent_pb2.COMMAND_STATUS_REJECTED
    assert "LD_PRELOAD" in result.message
    assert not (tmp_path / "specs-refused").exists(), "not even the first spec ran"


def test_a_wrong_result_in_the_first_spec_ends_the_job_there(
    executors: dict[str, BenchmarkExecutor], tmp_path: Path
) -> None:
    spec = _two_specs("specs-wrong")
    run = spec_to_proto(spec)
    nodes = sorted({s.node_name for s in spec.ranks})
    with ThreadPoolExecutor(len(nodes)) as pool:
        futures = {
            n: pool.submit(
                executors[n].execute,
                run,
                node_name=n,
                backend=Backend.GLOO,
                deadline_s=60,
                work_dir=tmp_path,
                fault=WorkerFault(corrupt_rank=1),
            )
            for n in nodes
        }
        failed = futures["n1"].result()
        # As the controller does once a node's part failed: the job is cancelled where it still runs (the
        # others' ranks would wait for rank 1 until the deadline).
        for n in nodes:
            executors[n].cancel(spec.job_id, "n1 failed")
        assert all(f.result().status != agent_pb2.COMMAND_STATUS_SUCCEEDED for f in futures.values())
    assert failed.status == agent_pb2.COMMAND_STATUS_FAILED
    assert failed.message.startswith("spec 0 of 2: ") and "wrong elements" in failed.message, failed.message
    assert {row.spec for r in failed.node_benchmark.ranks for row in r.sizes} == {0}, "the second spec never ran on n1"


def test_probe_measures_latency_and_bandwidth_between_two_agents(
    executors: dict[str, BenchmarkExecutor], tmp_path: Path
) -> None:
    probe = agent_pb2.Probe(
        probe_id="p1",
        peers=["n0", "n1"],
        message_bytes=1 << 20,
        rendezvous_host="127.0.0.1",
        peer_rendezvous_host="127.0.0.1",
        rendezvous_port=free_port(),
        iters=5,
    )
    results = _on_nodes(
        ("n0", "n1"),
        lambda n: executors[n].probe(probe, node_name=n, backend=Backend.GLOO, deadline_s=60, work_dir=tmp_path),
    )
    for node, peer in (("n0", "n1"), ("n1", "n0")):
        result = results[node]
        assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, result.message
        assert (result.probe.node_name, result.probe.peer) == (node, peer)
        assert result.probe.bandwidth_gbps > 0 and result.probe.latency_us > 0


def test_a_node_runs_one_job_at_a_time(tmp_path: Path) -> None:
    executor = BenchmarkExecutor(policy=EnvPolicy())
    # Rank 1 lives on a node that never runs it, so rank 0 waits at the rendezvous until the deadline.
    runs = [spec_to_proto(_spec(f"alone-{i}", nodes=("n0", "ghost"))) for i in range(2)]
    results = _on_nodes(
        ("0", "1"),
        lambda i: executor.execute(
            runs[int(i)], node_name="n0", backend=Backend.GLOO, deadline_s=10.0, work_dir=tmp_path
        ),
    )
    statuses = sorted(r.status for r in results.values())
    assert statuses == [agent_pb2.COMMAND_STATUS_TIMED_OUT, agent_pb2.COMMAND_STATUS_REJECTED]
    (busy,) = [r for r in results.values() if r.status == agent_pb2.COMMAND_STATUS_REJECTED]
    assert "already running" in busy.message
    (waited,) = [r for r in results.values() if r.status == agent_pb2.COMMAND_STATUS_TIMED_OUT]
    assert list(waited.node_benchmark.rank_status[0].waiting_for) == [1]


def test_ranks_pin_themselves_to_their_devices_cpus(tmp_path: Path) -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    executor = BenchmarkExecutor(policy=EnvPolicy(), cpus_for_device={-1: [cpu]})
    spec = _spec("pinned-1", collective=Collective.ALL_REDUCE, nodes=("n0",), ranks_per_node=2)
    result = executor.execute(
        spec_to_proto(spec), node_name="n0", backend=Backend.GLOO, deadline_s=60, work_dir=tmp_path
    )
    assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, result.message
    assert [rec["cpus"] for rec in _started_records(tmp_path, spec)] == [[cpu], [cpu]]


def test_the_nodes_own_worker_env_wins_over_the_jobs(tmp_path: Path) -> None:
    # A host that forbids NVLink multicast keeps it off whatever a trial asks for.
    executor = BenchmarkExecutor(policy=EnvPolicy(), node_env={"NCCL_NVLS_ENABLE": "0"})
    spec = _spec("node-env-1", nodes=("n0",), env={"NCCL_NVLS_ENABLE": "1", "NCCL_DEBUG": "WARN"})
    result = executor.execute(
        spec_to_proto(spec), node_name="n0", backend=Backend.GLOO, deadline_s=60.0, work_dir=tmp_path
    )
    assert result.status == agent_pb2.COMMAND_STATUS_SUCCEEDED, result.message
    [rank] = [rank_result_from_proto(r) for r in result.node_benchmark.ranks]
    assert rank.effective_env["NCCL_NVLS_ENABLE"] == "0"
    assert rank.effective_env["NCCL_DEBUG"] == "WARN"


async def test_a_new_address_does_not_let_a_second_job_run_beside_the_first(tmp_path: Path) -> None:
    # The controller reports another address at a re-registration (another controller, an IPv6 path) while
    # a job runs: that job keeps its sockets, and the node still runs one job at a time.
    executor = CommandExecutor(
        journal=Journal(tmp_path / "journal.sqlite3"), node_name="n0", backend=Backend.GLOO, work_dir=tmp_path
    )
    # Rank 1 lives on a node that never runs it, so rank 0 waits at the rendezvous.
    first_spec = _spec("rebind-1", nodes=("n0", "ghost"))
    first = asyncio.create_task(
        executor.run(agent_pb2.Command(command_id="c1", run_benchmark=spec_to_proto(first_spec), deadline_s=60))
    )
    progress = tmp_path / first_spec.job_id / "rank-0" / "progress.jsonl"
    await asyncio.to_thread(wait_until, lambda: progress.exists() and progress.read_text(), timeout=30)
    executor.rebind("127.0.0.2")
    second = await executor.run(
        agent_pb2.Command(
            command_id="c2", run_benchmark=spec_to_proto(_spec("rebind-2", nodes=("n0", "ghost"))), deadline_s=3
        )
    )
    executor.stop_benchmarks()
    await first
    assert second.status == agent_pb2.COMMAND_STATUS_REJECTED, second.message
    assert "already running" in second.message


def test_a_probe_figure_is_its_median_iteration_so_one_stall_does_not_slow_a_link() -> None:
    # 1 MiB in a mean of 25 ms (one iteration stalled) but a median of 20 ms: the link carries 52.4 MB/s.
    bandwidth = agent_pb2.SizeResult(
        bytes=1 << 20, time_us=25_000.0, algbw_gbps=(1 << 20) / 25_000 / 1e3, p50_us=20_000.0
    )
    latency = agent_pb2.SizeResult(bytes=8, time_us=90.0, p50_us=60.0)
    gbps, us = probe_figures(latency, bandwidth)
    assert gbps == pytest.approx((1 << 20) / 20_000 / 1e3, rel=1e-12) and us == 60.0
    # A backend that reports no per-iteration median keeps the mean.
    no_median = agent_pb2.SizeResult(bytes=1 << 20, time_us=25_000.0, algbw_gbps=0.0419)
    assert probe_figures(agent_pb2.SizeResult(bytes=8, time_us=90.0), no_median) == (0.0419, 90.0)
