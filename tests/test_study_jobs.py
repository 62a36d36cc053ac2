"""The study's benchmark jobs carry the search's timing settings to the controller, through the real admin API.

An embedded controller with local sim agents, as `topo-tune init` runs a sim cluster. The sim backend has no CPU
launch cost for CUDA graphs to remove, so a graph-timed trial must be refused by the controller with the field
named: proof that ``search.cudaGraph`` reaches every trial's job request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from topo_tune.cli.local_cluster import EmbeddedCluster
from topo_tune.client.admin import AdminClient
from topo_tune.config.cluster import loads_cluster_config
from topo_tune.errors import TrialFailed
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
