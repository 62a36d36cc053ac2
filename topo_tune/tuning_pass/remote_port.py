"""The tuning pass's ``admin_port.AdminPort`` over the admin client: what ``topo-tune init`` runs its pass through.

The admin API's messages are converted to the pass's domain objects (benchmark jobs, probe rounds, nodes) here,
at the client's edge. A controller that restarts under the pass (a crash, a redeploy, its database away) is
waited for, up to ``restart_wait_s`` (2 minutes by default), saying so once per outage, instead of ending the
pass: every call is retried until the controller answers. That is safe because each call is a read or an
idempotent write (a benchmark job goes out under an id chosen here, so a job the controller stored before it
died is found again, not started twice). Non-goals: the CLI's own calls (``client.AdminClient`` keeps the
messages), transport.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from datetime import UTC
from typing import TypeVar

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobStatus, SizeRange
from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound, ProbeStatus
from topo_tune.client.admin import PROBE_SAMPLING, AdminClient
from topo_tune.errors import ControllerUnavailable
from topo_tune.ids import JobId, NodeName
from topo_tune.tuning_pass.node_record import ClusterTopology, NodeInfo, NodeState
from topo_tune.v1 import admin_pb2, agent_pb2
from topo_tune.wire.benchmark import COLLECTIVE_TO_PROTO, collective_from_proto, size_from_proto
from topo_tune.wire.values import BACKEND_FROM_WIRE

T = TypeVar("T")
RESTART_WAIT_S = 120.0
"""How long the pass waits for a controller that stopped answering before it gives up."""

JOB_STATUS_FROM_WIRE = {
    admin_pb2.BENCHMARK_JOB_STATUS_RUNNING: JobStatus.RUNNING,
    admin_pb2.BENCHMARK_JOB_STATUS_SUCCEEDED: JobStatus.SUCCEEDED,
    admin_pb2.BENCHMARK_JOB_STATUS_FAILED: JobStatus.FAILED,
    admin_pb2.BENCHMARK_JOB_STATUS_TIMED_OUT: JobStatus.TIMED_OUT,
}


def benchmark_request_to_proto(request: BenchmarkRequest) -> admin_pb2.StartBenchmarkRequest:
    sizes = request.sizes
    return admin_pb2.StartBenchmarkRequest(
        collective=COLLECTIVE_TO_PROTO[request.collective]
        if request.collective is not None
        else agent_pb2.COLLECTIVE_UNSPECIFIED,
        nodes=list(request.nodes),
        sizes=agent_pb2.SizeSweep(min_bytes=sizes.min_bytes, max_bytes=sizes.max_bytes, step_factor=sizes.step_factor),
        dtype=request.dtype,
        warmup_iters=request.warmup_iters,
        iters=request.iters,
        env=dict(request.env),
        ranks_per_node=request.ranks_per_node,
        deadline_s=request.deadline_s,
        both_placements=request.both_placements,
        job_id=request.job_id,
        tuner_table=request.tuner_table,
        cuda_graph=request.cuda_graph,
        sim_seed=request.sim_seed,
    )


def benchmark_job_from_proto(job: admin_pb2.BenchmarkJob) -> BenchmarkJob:
    asked = job.sizes_requested
    return BenchmarkJob(
        job_id=JobId(job.job_id),
        status=JOB_STATUS_FROM_WIRE[job.status],
        message=job.message,
        collective=collective_from_proto(job.collective, field="job.collective"),
        nodes=tuple(job.nodes),
        world_size=job.world_size,
        dtype=job.dtype,
        env=dict(job.env),
        backend=BACKEND_FROM_WIRE.get(job.backend, ""),
        sizes_requested=SizeRange(asked.min_bytes, asked.max_bytes, asked.step_factor),
        iters=job.iters,
        warmup_iters=job.warmup_iters,
        cuda_graph=job.cuda_graph,
        tuner_table_sha256=job.tuner_table_sha256,
        created_at=job.created_at.ToDatetime(UTC),
        simulated=job.simulated,
        sizes=tuple(size_from_proto(row) for row in job.sizes),
        missing_ranks=tuple(job.missing_ranks),
        hung_ranks=tuple(job.hung_ranks),
        finished_at=job.finished_at.ToDatetime(UTC) if job.HasField("finished_at") else None,
    )


PROBE_STATUS_FROM_WIRE = {
    admin_pb2.PROBE_ROUND_STATUS_RUNNING: ProbeStatus.RUNNING,
    admin_pb2.PROBE_ROUND_STATUS_SUCCEEDED: ProbeStatus.SUCCEEDED,
    admin_pb2.PROBE_ROUND_STATUS_FAILED: ProbeStatus.FAILED,
}
PROBE_SAMPLING_NAMES = {wire: name for name, wire in PROBE_SAMPLING.items()}


def probe_request_to_proto(request: ProbeRequest) -> admin_pb2.StartProbeRoundRequest:
    return admin_pb2.StartProbeRoundRequest(
        nodes=list(request.nodes),
        message_bytes=request.message_bytes,
        pair_deadline_s=request.pair_deadline_s,
        sampling=PROBE_SAMPLING[request.sampling or "auto"],
        pairs=[admin_pb2.NodePair(node_a=a, node_b=b) for a, b in request.pairs],
    )


def pair_from_proto(pair: admin_pb2.PairMeasurement) -> PairMeasurement:
    return PairMeasurement(
        node_a=pair.node_a,
        node_b=pair.node_b,
        bandwidth_gbps=pair.bandwidth_gbps,
        latency_us=pair.latency_us,
        method=pair.method,
        measured_at=pair.measured_at.ToDatetime(UTC),
    )


def probe_round_from_proto(found: admin_pb2.ProbeRound) -> ProbeRound:
    sampling = PROBE_SAMPLING_NAMES.get(found.sampling, "auto")
    return ProbeRound(
        round_id=found.round_id,
        status=PROBE_STATUS_FROM_WIRE[found.status],
        message=found.message,
        nodes=tuple(found.nodes),
        # The wire says full or sparse; a round of listed pairs (or an older controller) leaves it unset.
        sampling="" if sampling == "auto" else sampling,
        rounds=found.rounds,
        pairs_total=found.pairs_total,
        measurements=tuple(pair_from_proto(m) for m in found.measurements),
        degraded_nodes=tuple(found.degraded_nodes),
        degraded_uplinks=tuple(found.degraded_uplinks),
        slow_pairs=tuple((p.node_a, p.node_b) for p in found.slow_pairs),
    )


def node_from_proto(node: admin_pb2.Node) -> NodeInfo:
    """A node as the pass reads it; any state but ready counts as lost (the controller sends no other)."""
    return NodeInfo(
        name=NodeName(node.name),
        rack=node.rack,
        state=NodeState.READY if node.state == admin_pb2.NODE_STATE_READY else NodeState.LOST,
        backend=BACKEND_FROM_WIRE.get(node.backend, ""),
        registrations=node.registrations,
        last_heartbeat_at=node.last_heartbeat_at.ToDatetime(UTC) if node.HasField("last_heartbeat_at") else None,
        labels=dict(node.labels),
        topology=node.topology if node.HasField("topology") else None,
    )


def cluster_topology_from_proto(view: admin_pb2.ClusterTopologyView) -> ClusterTopology:
    return ClusterTopology(
        nodes=tuple(node_from_proto(node) for node in view.nodes),
        spine_oversubscription=view.spine_oversubscription if view.HasField("spine_oversubscription") else None,
        spine_bandwidth_gbps=view.spine_bandwidth_gbps if view.HasField("spine_bandwidth_gbps") else None,
    )


class RemotePort:
    """``admin_port.AdminPort`` over the admin API: what ``topo-tune init`` runs its pass through.

    Converts between the pass's domain objects and the wire here, at the client's edge; rides out a controller
    restart of up to ``restart_wait_s``, calling ``on_wait`` with one line when it starts waiting."""

    def __init__(
        self,
        client: AdminClient,
        *,
        restart_wait_s: float = RESTART_WAIT_S,
        on_wait: Callable[[str], None] = lambda _line: None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.restart_wait_s = restart_wait_s
        self._on_wait = on_wait
        self._sleep = sleep

    def _riding_out(self, call: Callable[[], T]) -> T:
        """``call``, again and again while the controller cannot be reached, for up to ``restart_wait_s``."""
        since: float | None = None
        pause = 0.2
        while True:
            try:
                return call()
            except ControllerUnavailable as error:
                now = time.monotonic()
                if since is None:
                    since = now
                    self._on_wait(f"{error}; waiting up to {self.restart_wait_s:g} s for the controller to answer")
                elif now - since > self.restart_wait_s:
                    raise ControllerUnavailable(
                        f"{error} (waited {self.restart_wait_s:g} s for the controller to come back)"
                    ) from None
            self._sleep(pause)
            pause = min(pause * 2, 2.0)

    def list_nodes(self, *, rack: str = "") -> list[NodeInfo]:
        return self._riding_out(lambda: [node_from_proto(node) for node in self.client.list_nodes(rack=rack)])

    def cluster_topology(self) -> ClusterTopology:
        return self._riding_out(lambda: cluster_topology_from_proto(self.client.cluster_topology()))

    def start_probe_round(self, request: ProbeRequest) -> ProbeRound:
        # No id of our own to make a repeat idempotent: a round the controller stored but never answered for
        # runs again (a measurement repeated; nothing is counted twice).
        wire = probe_request_to_proto(request)
        return self._riding_out(lambda: probe_round_from_proto(self.client.start_probe_round(wire)))

    def get_probe_round(self, round_id: str) -> ProbeRound:
        return self._riding_out(lambda: probe_round_from_proto(self.client.get_probe_round(round_id)))

    def wait_probe_round(self, round_id: str) -> ProbeRound:
        return self._riding_out(lambda: probe_round_from_proto(self.client.wait_probe_round(round_id)))

    def measured_pairs(self) -> list[PairMeasurement]:
        return self._riding_out(lambda: [pair_from_proto(pair) for pair in self.client.measured_pairs().pairs])

    def start_benchmark(self, request: BenchmarkRequest) -> BenchmarkJob:
        if not request.job_id:  # our own id: a repeat after a restart finds the job the controller stored
            request = dataclasses.replace(request, job_id=f"bj-{uuid.uuid4().hex[:12]}")
        wire = benchmark_request_to_proto(request)
        return self._riding_out(lambda: benchmark_job_from_proto(self.client.start_benchmark(wire)))

    def get_benchmark(self, job_id: JobId) -> BenchmarkJob:
        return self._riding_out(lambda: benchmark_job_from_proto(self.client.get_benchmark(job_id)))

    def wait_benchmark(self, job_id: JobId) -> BenchmarkJob:
        return self._riding_out(lambda: benchmark_job_from_proto(self.client.wait_benchmark(job_id)))

    def put_config_version(
        self, files: dict[str, str], provenance: dict[str, str], *, version_id: str = ""
    ) -> admin_pb2.ConfigVersionInfo:
        return self._riding_out(lambda: self.client.put_config_version(files, provenance, version_id=version_id))
