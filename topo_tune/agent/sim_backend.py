"""The agent's ``sim`` backend: a benchmark job answered by the analytic model instead of GPUs.

The controller sends the simulated cluster with the job (``RunBenchmark.sim``), so every node of the job
computes the same figures from the same inputs and seed; this node reports them for its own ranks. The
job's environment goes through the same policy as on real hardware (a refused knob is refused here too),
the file ``NCCL_CONF_FILE`` names is read as NCCL reads it (so a rollout's A/B gate compares versions here
too), a candidate tuner table is applied per size as the plugin would, and every result is labelled simulated.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from topo_tune.benchmark.collectives import Collective, shape
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.wire import spec_from_proto
from topo_tune.config_version import parse_nccl_conf
from topo_tune.errors import SimInputError
from topo_tune.plugin.table import parse_tuner_table
from topo_tune.sim import Spine, simulate
from topo_tune.sim.cluster import Cluster
from topo_tune.sim.simulate import SimResult, SimSizeResult
from topo_tune.sim.topology_import import cluster_from_topologies
from topo_tune.v1 import agent_pb2


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


# The plugin's names -> NCCL_ALGO/NCCL_PROTO's, which is how the model restricts its choice to one entry.
_NCCL_ALGO = {
    "ring": "Ring",
    "tree": "Tree",
    "nvls": "NVLS",
    "nvls_tree": "NVLSTree",
    "collnet_direct": "CollnetDirect",
    "collnet_chain": "CollnetChain",
    "pat": "PAT",
}
_NCCL_PROTO = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
_PLUGIN_COLLECTIVE = {
    Collective.ALL_REDUCE: "allreduce",
    Collective.ALL_GATHER: "allgather",
    Collective.REDUCE_SCATTER: "reducescatter",
    Collective.BROADCAST: "broadcast",
    Collective.REDUCE: "reduce",
}


def _with_tuner_table(
    cluster: Cluster, spec: BenchmarkSpec, result: SimResult, *, order: list[str], env: Mapping[str, str]
) -> tuple[SimSizeResult, ...]:
    """Per size, the result under the job's tuner table, applied as the plugin does.

    The first row that matches a size and whose algorithm/protocol the model can run decides it: the model
    is restricted to that entry (a row it rules out is passed over, as NCCL's -1 entries are) and runs at the
    row's channel count, capped at the communicator's own, as NCCL caps a plugin's. Each variant is simulated
    over the whole ladder with the job's seed, so every size keeps the noise draw the job without a table
    would have seen (common random numbers).
    """
    collective = _PLUGIN_COLLECTIVE.get(spec.collective)
    if not spec.tuner_table or collective is None:
        return result.sizes
    rows = [r for r in parse_tuner_table(spec.tuner_table) if r.fits(n_nodes=len(order), n_ranks=spec.world_size)]
    comm_channels = max(s.channels for s in result.sizes)
    variants: dict[tuple[tuple[str, str], ...], SimResult | None] = {}
    out = []
    for index, size in enumerate(spec.sweep.sizes()):
        chosen = result.sizes[index]
        for row in (r for r in rows if r.applies(collective, size)):
            variant = dict(env)
            if row.algorithm is not None and row.protocol is not None:
                variant.update(NCCL_ALGO=_NCCL_ALGO[row.algorithm], NCCL_PROTO=_NCCL_PROTO[row.protocol])
            if row.channels is not None:
                channels = str(min(row.channels, comm_channels))
                variant.update(NCCL_MIN_CTAS=channels, NCCL_MAX_CTAS=channels)
            key = tuple(sorted(variant.items()))
            if key not in variants:
                try:
                    variants[key] = simulate(
                        cluster,
                        collective=spec.collective.value,
                        sizes=list(spec.sweep.sizes()),
                        env=variant,
                        rank_order=order,
                        seed=result.seed,
                        dtype=spec.dtype.name,
                    )
                except SimInputError:
                    variants[key] = None  # the model cannot run that entry here: NCCL's -1
            simulated = variants[key]
            if simulated is not None:
                chosen = simulated.sizes[index]
                break
        out.append(chosen)
    return tuple(out)


def run_simulated(
    run: agent_pb2.RunBenchmark, *, node_name: str, policy: EnvPolicy, now_ns: int
) -> agent_pb2.CommandResult:
    finished = Timestamp()
    finished.FromNanoseconds(now_ns)

    def refused(message: str) -> agent_pb2.CommandResult:
        return agent_pb2.CommandResult(status=agent_pb2.COMMAND_STATUS_REJECTED, message=message, finished_at=finished)

    try:
        spec = spec_from_proto(run)
        policy.check(spec.env)
    except ValueError as error:
        return refused(str(error))
    local = spec.local_slots(node_name)
    if not local:
        return refused(f"job {spec.job_id} has no rank on node {node_name}")
    if not run.HasField("sim") or not run.sim.nodes:
        return refused("a sim job needs the simulated cluster (RunBenchmark.sim)")
    order = list(dict.fromkeys(slot.node_name for slot in spec.ranks))
    spine = (
        Spine(oversubscription=run.sim.spine_oversubscription) if run.sim.HasField("spine_oversubscription") else None
    )
    try:
        cluster = cluster_from_topologies(list(run.sim.nodes), racks=dict(run.sim.rack_of), spine=spine)
        result = simulate(
            cluster,
            collective=spec.collective.value,
            sizes=list(spec.sweep.sizes()),
            env=_with_conf_file(spec.env),
            rank_order=order,
            seed=run.sim.seed,
            dtype=spec.dtype.name,
        )
        sizes = _with_tuner_table(cluster, spec, result, order=order, env=_with_conf_file(spec.env))
    except SimInputError as error:
        return refused(f"cannot simulate this job: {error}")
    node_result = agent_pb2.NodeBenchmarkResult(job_id=spec.job_id, node_name=node_name, simulated=True)
    for slot in local:
        rank = node_result.ranks.add(job_id=spec.job_id, rank=slot.rank, simulated=True, effective_env=dict(spec.env))
        for requested, size in zip(spec.sweep.sizes(), sizes, strict=True):
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
            )
        node_result.rank_status.add(
            rank=slot.rank, outcome=agent_pb2.RANK_OUTCOME_FINISHED, phase="finished", joined=True
        )
    return agent_pb2.CommandResult(
        status=agent_pb2.COMMAND_STATUS_SUCCEEDED,
        message=f"simulated {len(sizes)} sizes for {len(local)} ranks",
        finished_at=finished,
        node_benchmark=node_result,
    )
