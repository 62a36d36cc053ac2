"""The study's benchmark jobs carry the search's timing settings to the controller, through the real admin API.

An embedded controller with local sim agents, as `topo-tune init` runs a sim cluster. The sim backend has no CPU
launch cost for CUDA graphs to remove, so a graph-timed trial must be refused by the controller with the field
named: proof that ``search.cudaGraph`` reaches every trial's job request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from topo_tune.benchmark.job_record import BenchmarkRequest, NextSpecRequest, SizeRange
from topo_tune.cli.local_cluster import EmbeddedCluster
from topo_tune.client.admin import AdminClient
from topo_tune.config.cluster import loads_cluster_config
from topo_tune.errors import TrialFailed, ValidationError
from topo_tune.nccl.collectives import Collective
from topo_tune.node_record import NodeState
from topo_tune.tuner.space import RankOrder, TrialConfig
from topo_tune.tuner.study import MeasurementRequest
from topo_tune.tuning_pass.job_evaluator import JobEvaluator
from topo_tune.tuning_pass.remote_port import RemotePort
from topo_tune.tuning_pass.run import require_gpus, wait_for_nodes

CLUSTER = """apiVersion: topo-tune/v1
backend: sim
racks:
  - {name: r1, nodes: [{name: a1, gpus: 8}, {name: a2, gpus: 8}]}
"""
NODES = ("a1", "a2")


def _measure(address: str, token: str, *, cuda_graph: bool) -> float:
    config = TrialConfig(env={}, rank_order=RankOrder("hostfile", NODES))
    request = MeasurementRequest(collectives=("all_reduce",), sizes=(1 << 20,), trial=0, purpose="search")
    with AdminClient(address, token=token, timeout_s=60) as client:
        wait_for_nodes(RemotePort(client), list(NODES), timeout_s=60)
        evaluate = JobEvaluator(RemotePort(client), deadline_s=60, iters=5, warmup_iters=1, cuda_graph=cuda_graph)
        measured = evaluate(config, request)
    return measured.samples[0].time_us


async def test_a_graph_timed_search_sends_cuda_graph_with_every_job(tmp_path: Path) -> None:
    embedded = EmbeddedCluster(loads_cluster_config(CLUSTER), tmp_path)
    await embedded.start()
    try:
        eager = await asyncio.to_thread(_measure, embedded.address, embedded.token, cuda_graph=False)
        assert eager > 0
        with pytest.raises(TrialFailed, match="cuda_graph: CUDA graphs need the nccl backend; the nodes run sim"):
            await asyncio.to_thread(_measure, embedded.address, embedded.token, cuda_graph=True)
    finally:
        await embedded.stop()


def _gpu_check(address: str, token: str) -> None:
    with AdminClient(address, token=token, timeout_s=60) as client:
        port = RemotePort(client)
        nodes = wait_for_nodes(port, list(NODES), timeout_s=60)
        assert [(n.name, n.rack, n.state, n.backend, n.topology) for n in nodes] == [
            (name, "r1", NodeState.READY, "sim", None) for name in NODES
        ], "the node list carries no topology"
        assert all(n.last_heartbeat_at is not None and n.registrations == 1 for n in nodes)
        view = port.cluster_topology()
        gpus = {n.name: len(n.topology.gpus) if n.topology is not None else None for n in view.nodes}
        assert gpus == dict.fromkeys(NODES, 8), "the topology view carries each node's topology"
        assert view.spine_oversubscription is None and view.spine_bandwidth_gbps is None, "no spine in cluster.yaml"
        require_gpus(port, NODES)


async def test_nodes_whose_agents_discovered_gpus_pass_the_gpu_check(tmp_path: Path) -> None:
    # The sim agents discover 8 GPUs each; the node list the wait reads carries no topology, so a check
    # made on it would call every GPU node GPU-less (as it did on a real H200).
    embedded = EmbeddedCluster(loads_cluster_config(CLUSTER), tmp_path)
    await embedded.start()
    try:
        await asyncio.to_thread(_gpu_check, embedded.address, embedded.token)
    finally:
        await embedded.stop()


def _times(address: str, token: str, seed: int | None, requests: list[MeasurementRequest]) -> list[float]:
    config = TrialConfig(env={}, rank_order=RankOrder("hostfile", NODES))
    with AdminClient(address, token=token, timeout_s=60) as client:
        wait_for_nodes(RemotePort(client), list(NODES), timeout_s=60)
        evaluate = JobEvaluator(RemotePort(client), deadline_s=60, iters=5, warmup_iters=1, seed=seed)
        return [evaluate(config, r).samples[0].time_us for r in requests]


async def test_a_seeded_study_gets_the_same_sim_noise_for_the_same_measurement(tmp_path: Path) -> None:
    embedded = EmbeddedCluster(loads_cluster_config(CLUSTER), tmp_path)
    await embedded.start()
    search = MeasurementRequest(collectives=("all_reduce",), sizes=(1 << 20,), trial=3, purpose="search")
    pairs = [MeasurementRequest(("all_reduce",), (1 << 20,), 3, "proof", repeat, "baseline") for repeat in (0, 1)]
    try:
        seeded = await asyncio.to_thread(_times, embedded.address, embedded.token, 7, [search, search, *pairs])
        unseeded = await asyncio.to_thread(_times, embedded.address, embedded.token, None, [search, search])
    finally:
        await embedded.stop()
    assert seeded[0] == seeded[1], "the same measurement of a seeded study: the same figures, whatever the job id"
    assert len({seeded[0], seeded[2], seeded[3]}) == 3, "each proof pair (and the search) draws its own noise"
    assert unseeded[0] != unseeded[1], "without a seed each job draws its own"


def _pair(env: dict[str, str]) -> list[tuple[TrialConfig, MeasurementRequest]]:
    """A proof pair's plan as the proof asks it: each side's full ladder, then its small sizes again."""
    baseline = TrialConfig(env={}, rank_order=RankOrder("hostfile", NODES))
    candidate = TrialConfig(env=env, rank_order=RankOrder("hostfile", NODES[::-1]))
    # Two collectives; the full ladder is no geometric one (a sweep per size), the small sizes are: ten specs a side.
    ladder, small = (1 << 10, 1 << 14, 1 << 18, 3 << 20), (1 << 10, 1 << 14)
    asked = []
    for run, sizes in enumerate((ladder, small)):
        for side, config in (("baseline", baseline), ("candidate", candidate)):
            request = MeasurementRequest(("all_reduce", "all_gather"), sizes, 5, "proof", 2, side, run)  # type: ignore[arg-type]
            asked.append((config, request))
    return asked


def _one_job_and_job_by_job(address: str, token: str) -> tuple[list[object], list[object], list[int], list[int]]:
    with AdminClient(address, token=token, timeout_s=60) as client:
        wait_for_nodes(RemotePort(client), list(NODES), timeout_s=60)
        jobs: list[int] = []
        evaluate = JobEvaluator(
            RemotePort(client),
            deadline_s=60,
            iters=5,
            warmup_iters=1,
            seed=11,
            on_job=lambda job, _: jobs.append(len({row.spec for row in job.sizes})),
        )
        together = evaluate.many(_pair({"NCCL_MAX_CTAS": "8"}))
        per_call = [evaluate(config, request) for config, request in _pair({"NCCL_MAX_CTAS": "8"})]
        many_jobs, single_jobs = jobs[:1], jobs[1:]
        return list(together), list(per_call), many_jobs, single_jobs


async def test_a_proof_pair_is_one_job_whose_specs_measure_what_a_job_each_would(tmp_path: Path) -> None:
    embedded = EmbeddedCluster(loads_cluster_config(CLUSTER), tmp_path)
    await embedded.start()
    try:
        together, per_call, many_jobs, single_jobs = await asyncio.to_thread(
            _one_job_and_job_by_job, embedded.address, embedded.token
        )
    finally:
        await embedded.stop()
    # 2 sides x 2 collectives x (4 one-size sweeps, then 1 sweep of the small sizes): 20 specs, one job.
    assert many_jobs == [20], "the whole pair ran as one job of 20 specs"
    assert single_jobs == [8, 8, 2, 2], "a call alone: one job for its collectives and sweeps"
    assert together == per_call, "each spec's figures are those it gets as a job of its own (same seed, same rows)"
    assert [len(m.samples) for m in together] == [8, 8, 4, 4]  # type: ignore[attr-defined]
    sides = [{(s.collective, s.bytes) for s in m.samples} for m in together]  # type: ignore[attr-defined]
    assert sides[0] == sides[1] and sides[2] == sides[3], "both arms measured the same collectives and sizes"
    assert together[0] != together[1], "the candidate's setting and rank order are its own"


def _failing_arm(address: str, token: str) -> tuple[str, int]:
    with AdminClient(address, token=token, timeout_s=60) as client:
        wait_for_nodes(RemotePort(client), list(NODES), timeout_s=60)
        jobs: list[str] = []
        evaluate = JobEvaluator(
            RemotePort(client), deadline_s=60, iters=5, warmup_iters=1, on_job=lambda job, _: jobs.append(job.message)
        )
        with pytest.raises(TrialFailed) as failed:
            evaluate.many(_pair({"NCCL_NTHREADS": "33"}))
        return str(failed.value), len(jobs)


async def test_a_spec_that_cannot_run_fails_its_whole_pair_and_nothing_of_it_is_kept(tmp_path: Path) -> None:
    embedded = EmbeddedCluster(loads_cluster_config(CLUSTER), tmp_path)
    await embedded.start()
    try:
        message, jobs = await asyncio.to_thread(_failing_arm, embedded.address, embedded.token)
    finally:
        await embedded.stop()
    # The candidate's thread count is no multiple of 32: its spec cannot run, so neither arm's figures count
    # (a pair with one arm is no pair), and the reason names the variable.
    assert jobs == 1, "one job for the pair, ended by the spec that could not run"
    assert "NCCL_NTHREADS" in message, message


def _refused_next_spec(address: str, token: str) -> str:
    with AdminClient(address, token=token, timeout_s=60) as client:
        port = RemotePort(client)
        wait_for_nodes(port, list(NODES), timeout_s=60)
        request = BenchmarkRequest(
            collective=Collective.ALL_REDUCE,
            nodes=NODES,
            sizes=SizeRange(1024, 1024, 1),
            next_specs=(NextSpecRequest(Collective.ALL_GATHER, NODES[::-1]),),
        )
        with pytest.raises(ValidationError) as unsized:
            port.start_benchmark(request)
        other_nodes = NextSpecRequest(Collective.ALL_GATHER, NODES[:1], SizeRange(1024, 1024, 1))
        with pytest.raises(ValidationError) as elsewhere:
            port.start_benchmark(dataclasses.replace(request, next_specs=(other_nodes,)))
        return f"{unsized.value}\n{elsewhere.value}"


async def test_a_further_spec_on_other_nodes_is_refused_naming_it(tmp_path: Path) -> None:
    embedded = EmbeddedCluster(loads_cluster_config(CLUSTER), tmp_path)
    await embedded.start()
    try:
        message = await asyncio.to_thread(_refused_next_spec, embedded.address, embedded.token)
    finally:
        await embedded.stop()
    unsized, elsewhere = message.split("\n")
    assert unsized == "next_specs[0].sizes.min_bytes: must be >= 1, got 0", unsized
    assert elsewhere.startswith("next_specs[0].nodes: must list the job's nodes"), elsewhere
