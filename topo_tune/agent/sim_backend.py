"""The agent's ``sim`` backend: a benchmark job answered by the analytic model instead of GPUs.

The controller sends the simulated cluster with the job (``RunBenchmark.sim``), so every node of the job
computes the same figures from the same inputs and seed; this node reports them for its own ranks. The
job's environment goes through the same policy as on real hardware (a refused knob is refused here too),
the file ``NCCL_CONF_FILE`` names is read as NCCL reads it (so a rollout's A/B gate compares versions here
too), a candidate tuner table is applied per size as the plugin would, every size reports what the model's NCCL
offered and ran (as the ``nccl`` backend reports the plugin's record), and every result is labelled simulated.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from topo_tune.benchmark.collectives import shape
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.errors import SimInputError
from topo_tune.sim import SpineTier
from topo_tune.sim.cluster import Cluster
from topo_tune.sim.simulate import choice_of
from topo_tune.sim.topology_import import cluster_from_topologies
from topo_tune.sim.tuner_table import simulate_with_table
from topo_tune.v1 import agent_pb2
from topo_tune.versions.version import parse_nccl_conf
from topo_tune.wire.benchmark import spec_from_proto
from topo_tune.wire.values import timestamp_ns


def _with_conf_file(env: Mapping[str, str]) -> dict[str, str]:
    """The settings the simulated NCCL sees: as NCCL does, ``NCCL_CONF_FILE``'s values under the environment's."""
    merged = dict(env)
    if env.get("NCCL_CONF_FILE"):
        try:
            text = Path(env["NCCL_CONF_FILE"]).read_text()
        except (OSError, UnicodeDecodeError):
            text = ""  # NCCL skips a file it cannot read
        for key, value in parse_nccl_conf(text).items():
            merged.setdefault(key, value)  # setenv(..., overwrite=0): the environment wins
    return merged


def run_simulated(
    run: agent_pb2.RunBenchmark, *, node_name: str, policy: EnvPolicy, now_ns: int
) -> agent_pb2.CommandResult:
    finished = timestamp_ns(now_ns)

    def refused(message: str) -> agent_pb2.CommandResult:
        return agent_pb2.CommandResult(status=agent_pb2.COMMAND_STATUS_REJECTED, message=message, finished_at=finished)

    try:
        job = spec_from_proto(run)
        specs = job.specs()
        for spec in specs:
            policy.check(spec.env)
    except ValueError as error:
        return refused(str(error))
    local = job.local_slots(node_name)
    if not local:
        return refused(f"job {job.job_id} has no rank on node {node_name}")
    if not run.HasField("sim") or not run.sim.nodes:
        return refused("a sim job needs the simulated cluster (RunBenchmark.sim)")
    spine = None
    if run.sim.HasField("spine_oversubscription") or run.sim.HasField("spine_ecmp_paths"):
        spine = SpineTier(
            oversubscription=run.sim.spine_oversubscription if run.sim.HasField("spine_oversubscription") else 1.0,
            ecmp_paths=run.sim.spine_ecmp_paths if run.sim.HasField("spine_ecmp_paths") else 1,
        )
    seeds = [run.sim.seed, *(more.sim_seed for more in run.next_specs)]
    node_result = agent_pb2.NodeBenchmarkResult(job_id=job.job_id, node_name=node_name, simulated=True)
    try:
        cluster = cluster_from_topologies(list(run.sim.nodes), racks=dict(run.sim.rack_of), spine=spine)
        # Spec after spec, as a launched backend runs them; each with its own seed, so a spec's figures are
        # those it would have had as a job of its own.
        for index, (spec, seed) in enumerate(zip(specs, seeds, strict=True)):
            _simulate_spec(spec, index=index, cluster=cluster, seed=seed, node_name=node_name, into=node_result)
    except SimInputError as error:
        return refused(f"cannot simulate this job: {error}")
    for slot in local:
        node_result.rank_status.add(
            rank=slot.rank, outcome=agent_pb2.RANK_OUTCOME_FINISHED, phase="finished", joined=True
        )
    sizes = sum(len(list(spec.sweep.sizes())) for spec in specs)
    return agent_pb2.CommandResult(
        status=agent_pb2.COMMAND_STATUS_SUCCEEDED,
        message=f"simulated {sizes} sizes for {len(local)} ranks"
        + (f" in {len(specs)} specs" if len(specs) > 1 else ""),
        finished_at=finished,
        node_benchmark=node_result,
    )


def _simulate_spec(
    spec: BenchmarkSpec, *, index: int, cluster: Cluster, seed: int, node_name: str, into: agent_pb2.NodeBenchmarkResult
) -> None:
    """One spec's rows for this node's ranks (in that spec's rank map), each marked with the spec's place."""
    order = list(dict.fromkeys(slot.node_name for slot in spec.ranks))
    result = simulate_with_table(
        cluster,
        collective=spec.collective.value,
        sizes=list(spec.sweep.sizes()),
        env=_with_conf_file(spec.env),
        rank_order=order,
        seed=seed,
        dtype=spec.dtype.name,
        table=spec.tuner_table,
    )
    for slot in spec.local_slots(node_name):
        rank = into.ranks.add(job_id=spec.job_id, rank=slot.rank, simulated=True, effective_env=dict(spec.env))
        for requested, size in zip(spec.sweep.sizes(), result.sizes, strict=True):
            shp = shape(spec.collective, size_bytes=requested, element_size=spec.dtype.size, nranks=spec.world_size)
            rank.sizes.add(
                bytes=shp.reported_bytes,
                count=max(shp.send_count, shp.recv_count),
                time_us=size.time_us,
                algbw_gbps=size.algbw_gbs,
                busbw_gbps=size.busbw_gbs,
                p50_us=size.p50_us,
                p99_us=size.p99_us,
                cv=size.cv,
                in_place=False,
                checked=False,
                choice=choice_of(size),
                spec=index,
            )
