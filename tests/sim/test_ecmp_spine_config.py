"""cluster.yaml's ``spine.paths``/``hashing`` reach the sim agents that `topo-tune init` starts.

On a spine that hashes each flow onto one of several paths, more queue pairs per connection (more flows) collide
less: NCCL_IB_QPS_PER_CONNECTION matters there and nowhere else (benchmarks/results/search-efficiency.md: the
landscape where the search matters). Measured through the embedded controller and its local sim agents, as init
measures its trials.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from topo_tune.benchmark.job_record import BenchmarkRequest, JobStatus, SizeRange
from topo_tune.cli.local_cluster import EmbeddedCluster
from topo_tune.client.admin import AdminClient
from topo_tune.config.cluster import loads_cluster_config
from topo_tune.nccl.collectives import Collective
from topo_tune.tuning_pass.remote_port import RemotePort
from topo_tune.tuning_pass.run import wait_for_nodes

CLUSTER = """apiVersion: topo-tune/v1
backend: sim
racks:
  - {name: r1, nodes: [{name: a1, gpus: 8}, {name: a2, gpus: 8}]}
  - {name: r2, nodes: [{name: b1, gpus: 8}, {name: b2, gpus: 8}]}
spine: {oversubscription: 3, paths: 8, hashing: HASHING}
"""
NODES = ["a1", "a2", "b1", "b2"]


def _busbw_by_qps(address: str, token: str) -> dict[int, float]:
    out = {}
    with AdminClient(address, token=token, timeout_s=60) as client:
        wait_for_nodes(RemotePort(client), NODES, timeout_s=60)
        for qps in (1, 4):
            job = client.start_benchmark(
                BenchmarkRequest(
                    collective=Collective.ALL_REDUCE,
                    nodes=tuple(NODES),
                    sizes=SizeRange(min_bytes=256 << 20, max_bytes=256 << 20, step_factor=1),
                    env={"NCCL_IB_QPS_PER_CONNECTION": str(qps)},
                    iters=5,
                    warmup_iters=1,
                    deadline_s=60,
                    # The sim seeds its noise from the job id: fixed ids give both spines the same draws.
                    job_id=f"qps-{qps}",
                )
            )
            while job.status is JobStatus.RUNNING:
                time.sleep(0.05)
                job = client.get_benchmark(job.job_id)
            assert job.status is JobStatus.SUCCEEDED, job.message
            assert job.simulated
            out[qps] = max(size.busbw_gbps for size in job.sizes)
    return out


async def _measure(tmp_path: Path, hashing: str) -> dict[int, float]:
    cluster = loads_cluster_config(CLUSTER.replace("HASHING", hashing))
    embedded = EmbeddedCluster(cluster, tmp_path / hashing)
    await embedded.start()
    try:
        return await asyncio.to_thread(_busbw_by_qps, embedded.address, embedded.token)
    finally:
        await embedded.stop()


async def test_an_ecmp_spine_from_cluster_yaml_rewards_more_queue_pairs_and_an_adaptive_one_does_not(
    tmp_path: Path,
) -> None:
    ecmp = await _measure(tmp_path, "ecmp")
    adaptive = await _measure(tmp_path, "adaptive")
    # 8 hashed paths: one flow per connection collides often (about 1.3x slower here); an adaptive spine
    # only shows the sim's per-job noise (a few percent).
    assert ecmp[4] > 1.2 * ecmp[1], ecmp
    assert abs(adaptive[4] / adaptive[1] - 1) < 0.04, adaptive
    # Hash collisions only cost bandwidth: the adaptive spine is at least as fast with either setting.
    assert adaptive[1] > ecmp[1]
