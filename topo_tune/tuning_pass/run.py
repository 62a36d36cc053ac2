"""One pass of ``topo-tune init``: discover → probe → tune → prove → write.

The pass talks to a controller only through the admin API (embedded or remote, it makes no difference):
it waits for the nodes of ``cluster.yaml`` to be ready, probes every node pair on real backends, builds the
topology model and the ring-order candidates, runs the study (each trial is a set of benchmark jobs
dispatched to the agents), proves the finalists against NCCL's defaults, and writes the outputs and the
config version. The study lives in the controller's database, so running the same command again after a
crash or Ctrl-C resumes it: no trial is lost or counted twice.

Non-goals: rollouts (``admin rollout``), and measuring anything itself — every figure comes from agents.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from topo_tune.benchmark.probe_record import ProbeRequest, ProbeRound, ProbeStatus
from topo_tune.benchmark.sweep import size_ladder
from topo_tune.config.cluster import ClusterConfig
from topo_tune.errors import ConfigError, PassError
from topo_tune.kube.rack import tiers_above
from topo_tune.learning.carried import carried_challengers
from topo_tune.node_record import NodeInfo, NodeState
from topo_tune.topology import Measurement, PairMatrix, Spine, build_cluster
from topo_tune.topology.gpu_ranks import gpu_ranks
from topo_tune.topology.sampling import default_mode, infer_pairs
from topo_tune.tuner.objective import Objective, workload_profile
from topo_tune.tuner.outputs import ClusterShape, WrittenOutputs, write_cluster_time, write_outputs
from topo_tune.tuner.ring.rank_map import plan_rank_map
from topo_tune.tuner.space import NATURAL_ORDER, Fabric, RankOrder, SearchSpace
from topo_tune.tuner.study import Candidate, StudyOutcome, StudyProgress, StudySettings, run_study, stored_rank_orders
from topo_tune.tuner.study_records import plural
from topo_tune.tuner.timeout_advice import MIN_SAMPLES, advise, latencies_of
from topo_tune.tuner.workload_gain import WorkloadSource
from topo_tune.tuning_pass.cluster_time import ClusterClock
from topo_tune.tuning_pass.controller_port import AdminPort
from topo_tune.tuning_pass.job_evaluator import JobEvaluator
from topo_tune.v1 import topology_pb2

logger = logging.getLogger(__name__)

DEFAULT_NCCL_VERSION = "2.28.9"
"""The search space's NCCL version when no agent reports one (sim and gloo nodes run no NCCL)."""


@dataclass(frozen=True)
class PassResult:
    outcome: StudyOutcome
    written: WrittenOutputs
    nodes: tuple[str, ...]
    measured_pairs: int
    cluster_time: ClusterClock
    """Wall time and node-seconds per phase (``summary.json``'s ``cluster_time`` is its state before the outputs)."""


def carry_challengers(outcome: StudyOutcome, shipped_table: str) -> tuple[dict[str, str], dict[str, str]]:
    """The challenger tables the version carries with learning on (``learning.carried``): the proof's other
    finalists and its named trade-off, where the proof showed them non-inferior in every bucket they change."""
    finalists = [*outcome.proofs, *([outcome.tradeoff.proof] if outcome.tradeoff is not None else [])]
    carried = carried_challengers(outcome.chosen, finalists, shipped_table=shipped_table, max_loss=outcome.max_loss)
    return carried.files, carried.provenance


def last_heard(node: NodeInfo | None, now: float) -> str:
    """What the controller last heard from a node that is not ready, in a few words."""
    if node is None:
        return "never registered"
    if node.state is NodeState.READY:
        return "ready"
    if node.last_heartbeat_at is None:
        return f"lost: no heartbeat recorded, {node.registrations} registrations"
    silent = now - node.last_heartbeat_at.timestamp()
    return f"lost: last heartbeat {max(0.0, silent):.0f} s ago, {node.registrations} registrations"


def wait_for_nodes(
    client: AdminPort,
    names: Sequence[str],
    *,
    timeout_s: float,
    on_wait: Callable[[int, list[str]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[NodeInfo]:
    """The nodes, once every one is ``ready``; ``on_wait(ready, missing)`` on each poll until then.

    ``PassError`` after the timeout, naming each missing node with what was last heard from it, and any
    node that registered under a name cluster.yaml does not list (an agent without ``--node-name``).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[str, NodeInfo] = {n.name: n for n in client.list_nodes()}  # keyed as cluster.yaml names them
        missing = [n for n in names if n not in found or found[n].state is not NodeState.READY]
        if not missing:
            return [found[n] for n in names]
        if time.monotonic() > deadline:
            now = time.time()
            heard = "; ".join(f"{name} ({last_heard(found.get(name), now)})" for name in missing)
            strangers = sorted(set(found) - set(names))
            unlisted = f"; registered but not in cluster.yaml: {', '.join(strangers)}" if strangers else ""
            raise PassError(
                f"{len(missing)} of {len(names)} nodes not ready after {timeout_s:g} s: {heard}{unlisted} "
                "(start their agents: topo-tune agent run --controller …)"
            )
        if on_wait is not None:
            on_wait(len(names) - len(missing), missing)
        sleep(0.2)


def require_gpus(client: AdminPort, names: Sequence[str]) -> None:
    """``PassError`` naming the first of ``names`` whose agent discovered no GPU (an ``nccl`` pass needs them).

    Read from the cluster topology view: the node list carries no topologies.
    """
    view = client.cluster_topology()
    gpuless = [n.name for n in view.nodes if n.name in names and (n.topology is None or not n.topology.gpus)]
    if gpuless:
        raise PassError(
            f"node {gpuless[0]} reports no GPU (its agent found none): backend nccl needs GPUs"
            + (f" (and {len(gpuless) - 1} more nodes have none)" if len(gpuless) > 1 else "")
            + "; to try topo-tune on CPUs, use backend gloo (examples/local-gloo.yaml)"
        )


def _sparse(cluster: ClusterConfig, nodes: int) -> bool:
    policy = cluster.search.probe_sampling
    return policy == "sparse" or (policy == "auto" and default_mode(nodes) == "sparse")


def measure_pairs(
    client: AdminPort,
    names: Sequence[str],
    *,
    sampling: str = "auto",
) -> int:
    """Probe the pairs of the nodes (every pair, or a sparse sample); returns how many pairs were measured."""
    request = ProbeRequest(nodes=tuple(names), message_bytes=1 << 20, sampling="" if sampling == "auto" else sampling)
    return _finished_round(client, client.start_probe_round(request))


RING_CHECKS = 2
"""Rounds of probing the inferred pairs on the ring planned from a sparse sample."""


def network_tiers(nodes: Sequence[NodeInfo], names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """node → the network tiers above its rack (a spine block…) that its registration's labels name, top first
    (``kube.rack``); a node naming none is left out. The ring planner keeps each tier's groups together."""
    wanted = set(names)
    return {n.name: tiers for n in nodes if n.name in wanted and (tiers := tiers_above(n.labels))}


def check_ring(client: AdminPort, cluster: ClusterConfig, names: Sequence[str]) -> int:
    """After a sparse sample: plan the ring on the mixed matrix and probe the pairs on it that were inferred
    (an inferred pair may be slower than its group's median), up to `RING_CHECKS` times; returns how many
    pairs were measured."""
    measured = 0
    tiers = network_tiers(client.cluster_topology().nodes, names)
    for _ in range(RING_CHECKS):
        pairs, _, _ = _pair_matrix(client, cluster, names)
        order = plan_rank_map(pairs, slots=1, rack_of=cluster.rack_of(), tiers_of=tiers).planned.order
        edges = [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))] if len(order) > 2 else []
        unprobed = sorted({(min(a, b), max(a, b)) for a, b in edges if pairs.get(a, b).source == "inferred"})
        if not unprobed:
            break
        request = ProbeRequest(pairs=tuple(unprobed), message_bytes=1 << 20)
        measured += _finished_round(client, client.start_probe_round(request))
    return measured


def _finished_round(client: AdminPort, found: ProbeRound) -> int:
    if found.status is ProbeStatus.RUNNING:
        found = client.wait_probe_round(found.round_id)
    if found.status is not ProbeStatus.SUCCEEDED:
        raise PassError(f"probe round {found.round_id} failed: {found.message}")
    return len(found.measurements)


def _pair_matrix(
    client: AdminPort, cluster: ClusterConfig, nodes: Sequence[str]
) -> tuple[PairMatrix, dict[str, topology_pb2.NodeTopology], str]:
    view = client.cluster_topology()
    # A node whose agent reported no topology is modelled with nothing discovered.
    empty = topology_pb2.NodeTopology()
    topologies: dict[str, topology_pb2.NodeTopology] = {
        n.name: n.topology if n.topology is not None else empty for n in view.nodes if n.name in nodes
    }
    spine = None
    if cluster.spine is not None:
        spine = Spine(
            oversubscription=cluster.spine.oversubscription or 1.0, bandwidth_gbps=cluster.spine.bandwidth_gbps
        )
    racks = {n: r for n, r in cluster.rack_of().items() if n in topologies}
    model = build_cluster(topologies, racks, spine=spine, tiers_of=network_tiers(view.nodes, nodes))
    found = [m for m in client.measured_pairs() if m.node_a in topologies and m.node_b in topologies]
    if _sparse(cluster, len(topologies)) and found:
        # A sparse sample: the pairs it left out are inferred from what it measured (rack by rack), not from
        # nominal NIC rates, and marked inferred.
        rack_of = model.rack_of
        inferred = infer_pairs(rack_of, [(m.node_a, m.node_b, m.bandwidth_gbps, m.latency_us) for m in found])
        pairs = inferred.to_pair_matrix(method="sparse probe sample").reordered(model.node_order())
    else:
        pairs = model.node_pairs()
    for measured in found:
        pairs = pairs.with_measurement(
            measured.node_a,
            measured.node_b,
            Measurement(
                bandwidth_gbps=measured.bandwidth_gbps,
                latency_us=measured.latency_us,
                measured_at=measured.measured_at,
                method=measured.method,
            ),
        )
    return pairs, topologies, model.fingerprint


def _nccl_version(cluster: ClusterConfig, topologies: dict[str, topology_pb2.NodeTopology]) -> str:
    if cluster.search.nccl_version:
        return cluster.search.nccl_version
    versions = {t.versions.nccl for t in topologies.values() if t.versions.nccl and t.versions.nccl[0].isdigit()}
    if len(versions) > 1:
        raise PassError(f"the nodes run different NCCL versions ({', '.join(sorted(versions))}): one study per version")
    return versions.pop() if versions else DEFAULT_NCCL_VERSION


def _fabric(cluster: ClusterConfig, topologies: dict[str, topology_pb2.NodeTopology]) -> Fabric:
    rdma = (topology_pb2.NIC_LINK_LAYER_INFINIBAND, topology_pb2.NIC_LINK_LAYER_ROCE)
    ib = all(any(nic.link_layer in rdma for nic in t.nics) for t in topologies.values())
    nvswitch = all(any(link.via_nvswitch for link in t.gpu_links) for t in topologies.values())
    # NVLink multicast kept off in every node's workers (workerEnv) is not a setting to search.
    nvls_off = all(n.worker_env.get("NCCL_NVLS_ENABLE") == "0" for r in cluster.racks for n in r.nodes)
    return Fabric(
        nodes=len(topologies), ib=ib, socket=not ib, nvls=nvswitch and cluster.backend.plays_nccl and not nvls_off
    )


@dataclass(frozen=True)
class StudyPlan:
    """The study a pass runs: its space (rank orders included), objective, settings and enqueued candidates."""

    space: SearchSpace
    objective: Objective
    settings: StudySettings
    candidates: tuple[Candidate, ...]


def plan_study(
    cluster: ClusterConfig,
    *,
    names: Sequence[str],
    pairs: PairMatrix,
    topologies: dict[str, topology_pb2.NodeTopology],
    slots: dict[str, int],
    name: str,
    storage: str,
    tiers: Mapping[str, tuple[str, ...]] | None = None,
) -> StudyPlan:
    """The study ``cluster`` asks for over ``names`` (listed rack by rack), from their pair matrix and the
    network tiers above their racks (`network_tiers`).

    The rank-order dimension holds NCCL's natural order (the launcher's: hostfiles list sorted host names),
    the ring-order optimizer's order and cluster.yaml's own listing, when they differ; the last two are
    enqueued after the baseline as candidates. A study already stored under ``name`` keeps the orders it
    started with.
    """
    natural = tuple(sorted(names))
    stored = stored_rank_orders(storage, name)
    if stored is not None and all(sorted(o.nodes) == list(natural) for o in stored):
        # A resumed study: the pairs were probed again, and noise may have moved the ring optimizer's choice.
        orders = list(stored)
    else:
        planned = plan_rank_map(pairs, slots=slots, naive_order=natural, rack_of=cluster.rack_of(), tiers_of=tiers)
        orders = [RankOrder(NATURAL_ORDER, natural)]
        for order_name, order in (("optimized", tuple(planned.planned.order)), ("racks", tuple(names))):
            if order not in {o.nodes for o in orders}:
                orders.append(RankOrder(order_name, order))
    space = SearchSpace.build(
        nccl_version=_nccl_version(cluster, topologies),
        fabric=_fabric(cluster, topologies),
        collectives=[c for c, w in cluster.workload.collectives.items() if w > 0],
        rank_orders=orders,
        site_fixed=cluster.site_fixed,
        knobs=cluster.search.knobs,
    )
    objective = Objective(workload_profile(cluster.workload))
    search = cluster.search
    ladder = size_ladder(min_bytes=search.min_bytes, max_bytes=search.max_bytes, step_factor=search.step_factor)
    settings = StudySettings(
        name=name,
        storage=storage,
        budget=search.budget,
        sampler=search.sampler,
        seed=search.seed,
        ladder=ladder,
        rungs=min(search.rungs, len(ladder)),
        finalists=search.finalists,
        proof_pairs=search.proof_pairs,
        proof_pairs_max=max(search.proof_pairs_max, search.proof_pairs),
        min_effect=search.min_effect,
        max_loss=search.max_loss,
    )
    candidates = tuple(Candidate(o.name, space.params_for(rank_order=o.name)) for o in orders[1:])
    return StudyPlan(space, objective, settings, candidates)


def run_pass(
    cluster: ClusterConfig,
    client: AdminPort,
    *,
    output: Path,
    storage: str,
    node_timeout_s: float = 120.0,
    on_status: Callable[[str], None] = lambda _: None,
    on_progress: Callable[[StudyProgress], None] | None = None,
) -> PassResult:
    """The whole pass against the controller ``client`` talks to."""
    names = [node.name for rack in cluster.racks for node in rack.nodes]
    if not names:
        raise ConfigError("racks", "cluster.yaml lists no node to tune")
    clock = ClusterClock(simulated=cluster.backend.simulated)
    clock.begin("nodes", nodes=len(names))
    on_status(f"waiting for nodes: 0/{len(names)} ready")

    def waiting(ready: int, missing: list[str]) -> None:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        on_status(f"waiting for nodes: {ready}/{len(names)} ready, missing {', '.join(missing[:3])}{more}")

    wait_for_nodes(client, names, timeout_s=node_timeout_s, on_wait=waiting)
    if cluster.backend.runs_nccl:
        require_gpus(client, names)
    measured = 0
    clock.begin("probe", nodes=len(names))
    if not cluster.backend.simulated and len(names) > 1:
        if _sparse(cluster, len(names)):
            on_status(f"probing a sparse sample of {len(names) * (len(names) - 1) // 2} node pairs")
        else:
            on_status(f"probing {len(names) * (len(names) - 1) // 2} node pairs")
        measured = measure_pairs(client, names, sampling=cluster.search.probe_sampling)
        if _sparse(cluster, len(names)):
            on_status("probing the inferred pairs on the planned ring")
            measured += check_ring(client, cluster, names)
    pairs, topologies, fingerprint = _pair_matrix(client, cluster, names)
    tiers = network_tiers(client.cluster_topology().nodes, names)
    # Ranks per node as the benchmark jobs place them: every GPU (nccl, sim; times its agent's ranks per GPU),
    # one process (gloo).
    slots: dict[str, int] = {
        name: max(1, gpu_ranks(topologies[name])) if cluster.backend.plays_nccl else 1 for name in names
    }
    if sum(slots.values()) == 1:
        on_status(
            "one rank in all: a collective on one rank moves no data, so the trials measure launch jitter and "
            "nothing is expected to be shown faster; tune with two or more GPUs for a result that counts"
        )
    nccl_version = _nccl_version(cluster, topologies)
    plan = plan_study(
        cluster,
        names=names,
        pairs=pairs,
        topologies=topologies,
        slots=slots,
        name=f"init/{cluster.metadata.name}/{nccl_version}/{fingerprint}/{cluster.backend}/{len(names)}",
        storage=storage,
        tiers=tiers,
    )
    search = cluster.search
    settings = dataclasses.replace(
        plan.settings,
        worker_id="topo-tune-init",
        heartbeat_interval_s=5.0,
        stale_after_s=max(60.0, 2 * search.job_deadline),
        poll_interval_s=0.2,
        # After the search, a candidate tuner-plugin table from the per-bucket winners is measured for the
        # job's communicator (unless cluster.yaml turns it off); gloo never loads NCCL's plugin, so there it
        # would measure nothing.
        table_shape=(len(names), sum(slots.values())) if search.tuner_table and cluster.backend.plays_nccl else None,
    )
    space, objective, candidates = plan.space, plan.objective, list(plan.candidates)
    on_status(
        f"searching: {plural(search.budget, 'trial')} ({search.sampler}; per-size/table trials come after), then "
        f"proving up to {plural(search.finalists, 'finalist')}"
    )
    evaluator = JobEvaluator(
        client,
        deadline_s=search.job_deadline,
        iters=search.iters,
        warmup_iters=search.warmup_iters,
        cuda_graph=search.cuda_graph,
        seed=search.seed,
        on_job=lambda job, wall_s: clock.job(job, wall_s=wall_s),
    )

    def progressed(update: StudyProgress) -> None:
        if update.phase in ("search", "proof") and clock.current != update.phase:
            clock.begin(update.phase, nodes=len(names))
        if on_progress is not None:
            on_progress(update)

    clock.begin("search", nodes=len(names))
    started = time.monotonic()
    outcome = run_study(
        settings, space=space, objective=objective, evaluate=evaluator, candidates=candidates, on_progress=progressed
    )
    clock.end()
    logger.info("study finished in %.1f s", time.monotonic() - started, extra={"study": settings.name})
    # A short study (a small budget, failed trials) may not measure a collective often enough to fit its
    # latency: the advice leaves that collective out, and the pass goes on without advice if none is left.
    measured_latencies = latencies_of(outcome)
    latencies = {c: times for c, times in measured_latencies.items() if len(times) >= MIN_SAMPLES}
    for collective in sorted(set(measured_latencies) - set(latencies)):
        logger.warning("no timeout advice for %s: fewer than %d measurements", collective, MIN_SAMPLES)
    clock.begin("outputs", nodes=0)
    on_status(f"writing outputs to {output}")
    written = write_outputs(
        outcome,
        output,
        shape=ClusterShape(slots=slots, pairs=pairs, racks=cluster.rack_of(), tiers=tiers),
        nccl_version=nccl_version,
        topology_fingerprint=fingerprint,
        advice=advise(latencies) if latencies else None,
        table_bucket_rows=search.tuner_table,
        workload=WorkloadSource(cluster.workload.source, cluster.workload.collective_time_us),
        carry=carry_challengers if cluster.learning.enabled else None,
    )
    version = written.config_version
    client.put_config_version(dict(version.files), dict(version.provenance), version_id=version.id)
    clock.end()
    write_cluster_time(output, clock.to_json())
    return PassResult(outcome=outcome, written=written, nodes=tuple(names), measured_pairs=measured, cluster_time=clock)
