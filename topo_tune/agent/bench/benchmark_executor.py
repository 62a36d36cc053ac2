"""The agent's entry for benchmark and probe commands: wire message in, ``CommandResult`` out.

``BenchmarkExecutor.execute`` validates a ``RunBenchmark`` (spec and environment policy), runs
this node's ranks through the ``Launcher`` and maps the outcome onto a status:

- ``REJECTED``: bad input (a malformed candidate tuner table included, or a deadline beyond
  ``MAX_DEADLINE_S``), a refused environment, a backend this executor does not run, a node with
  no rank in the job, or another job still running here (the message says which);
- ``TIMED_OUT``: the deadline passed; ``NodeBenchmarkResult.rank_status`` says which ranks hung,
  in which phase, and which ranks they were still waiting for;
- ``FAILED``: a rank failed, the data check found a wrong element (a wrong result fails the
  trial, architecture invariant 2), or the controller cancelled the job (``cancel``: a node of it was lost,
  or a rank failed elsewhere), before or while it ran here;
- ``SUCCEEDED`` otherwise.

A job with a candidate ``tuner_table`` has it staged by ``TunerPluginStage`` (the table in the agent's
own directory, ``NCCL_TUNER_PLUGIN``/``NCCL_TUNER_CONFIG_FILE`` set) before the environment policy
checks the result, so the paths must lie in the policy's directories like any other. An ``nccl`` job
without a table gets the plugin with an empty one, which changes nothing and records, per size, what
NCCL offered and chose (reported with each size).

``probe`` measures the link between this node and one peer at two sizes (latency and bandwidth)
through the same launcher, and reports the rate **one direction** of the link carries, as nccl-tests'
sendrecv algbw does (and as the ``sim`` model's node-pair figure is): with ``nccl`` a two-rank
sendrecv, both directions at once; with ``gloo``, whose sendrecv moves one direction at a time (it
would read half a full-duplex link), two one-way jobs in turn — a two-rank broadcast rooted at
``peers[0]``, then one rooted at ``peers[1]`` — each node reporting the direction into it, timed as
the receiver (the sender's clock stops once its data sits in the socket buffer). The controller keeps
the slower direction. Each figure is from the size's median iteration (``probe_figures``). Both calls
block; run them in a thread. The executor stays usable after any outcome: hung workers are killed with
their process groups.

Non-goals: gRPC, command ids and acknowledgements (the agent's session code sets
``command_id`` on the returned result), the ``sim`` backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from topo_tune.agent.bench.kept_workers import DEFAULT_IDLE_S, DEFAULT_MAX_RSS_BYTES, KeptWorkers
from topo_tune.agent.bench.launcher import Launcher, NodeOutcome
from topo_tune.agent.bench.tuner_plugin import TunerPluginStage
from topo_tune.agent.bench.worker_config import WorkerFault
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import MAX_DEADLINE_S, BenchmarkSpec, RankSlot
from topo_tune.benchmark.results import RankOutcome
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.errors import JobCancelled, LauncherBusy
from topo_tune.nccl.backends import LAUNCHED_BACKENDS, Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import node_result_to_proto, spec_from_proto
from topo_tune.wire.values import timestamp_ns

__all__ = ["DEFAULT_PROBE_ITERS", "BenchmarkExecutor", "probe_figures", "probe_specs"]

logger = logging.getLogger(__name__)

DEFAULT_PROBE_ITERS = 20
_DEFAULT_LATENCY_BYTES = 8
_PROBE_JOB_SUFFIXES = ("-out", "-back")
"""A gloo probe's one-way jobs are ``probe-<id>-out`` and ``probe-<id>-back`` (see ``probe_specs``)."""
"""The backends run as real processes (a sim agent computes its figures, it runs no ranks)."""


class BenchmarkExecutor:
    """One per agent process: owns one launcher per real backend (one job at a time each)."""

    def __init__(
        self,
        *,
        policy: EnvPolicy,
        bind_address: str = "127.0.0.1",
        passthrough: Mapping[str, str] | None = None,
        node_env: Mapping[str, str] | None = None,
        tuner_plugin: TunerPluginStage | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        cpus_for_device: Mapping[int, Sequence[int]] | None = None,
        ranks_per_gpu: int = 1,
        kept_worker_sets: int = 0,
        kept_idle_s: float = DEFAULT_IDLE_S,
        kept_max_rss_bytes: int = DEFAULT_MAX_RSS_BYTES,
        kept_communicators: bool = True,
        fork_server: bool = True,
    ) -> None:
        """``kept_worker_sets``: idle worker sets each launcher keeps for later jobs of the same environment
        (0: every job starts fresh workers); see ``kept_workers``. ``kept_communicators``: a kept set keeps its
        communicator too, for a job of the same membership (see ``kept_communicator``). ``fork_server``: fresh
        workers are forked from a pre-imported process (``fork_server``)."""
        self._policy = policy
        self._tuner_plugin = tuner_plugin
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._launchers = {
            name: Launcher(
                backend=name,
                bind_address=bind_address,
                passthrough=passthrough,
                node_env=node_env,
                clock=monotonic,
                cpus_for_device=cpus_for_device,
                ranks_per_gpu=ranks_per_gpu,
                kept=KeptWorkers(
                    max_sets=kept_worker_sets,
                    idle_s=kept_idle_s,
                    max_rss_bytes=kept_max_rss_bytes,
                    keep_communicators=kept_communicators,
                ),
                fork_server=fork_server,
            )
            for name in LAUNCHED_BACKENDS
        }

    def rebind(self, address: str) -> None:
        """Bind the next job's ranks to ``address``; a running job keeps its sockets."""
        for launcher in self._launchers.values():
            launcher.rebind(address)

    def kept(self, backend: Backend) -> KeptWorkers | None:
        """The idle worker sets of ``backend``'s launcher (None: no launcher runs it)."""
        launcher = self._launcher(backend)
        return None if launcher is None else launcher.kept

    def stop(self) -> None:
        """The agent is stopping: kill the ranks of the job running here, if any, and every kept worker; take no
        more jobs."""
        for launcher in self._launchers.values():
            launcher.stop()

    def cancel(self, job_id: str, reason: str) -> bool:
        """End job ``job_id`` here (see ``Launcher.cancel``); a probe is cancelled as ``probe-<probe_id>``.
        True when it was running here."""
        ids = [job_id]
        if job_id.startswith("probe-"):
            ids += [f"{job_id}{suffix}" for suffix in _PROBE_JOB_SUFFIXES]
        # Every id on every launcher: a job's later command must find it cancelled, whatever it runs on.
        return any([launcher.cancel(each, reason) for launcher in self._launchers.values() for each in ids])

    def _result(self, status: agent_pb2.CommandStatus.ValueType, message: str) -> agent_pb2.CommandResult:
        finished = timestamp_ns(int(self._wall_clock() * 1e9))
        return agent_pb2.CommandResult(status=status, message=message, finished_at=finished)

    def _launcher(self, backend: Backend) -> Launcher | None:
        return self._launchers.get(backend)

    def _prepare(
        self, backend: Backend, build: Callable[[], BenchmarkSpec], deadline_s: float
    ) -> tuple[Launcher, tuple[BenchmarkSpec, ...]] | agent_pb2.CommandResult:
        """The launcher and the job's validated specs in run order, or the ``REJECTED`` result saying why not.

        Every spec is checked (and its table staged) before the first runs: a job refused for its last spec
        runs none."""
        launcher = self._launcher(backend)
        if launcher is None:
            return self._result(agent_pb2.COMMAND_STATUS_REJECTED, f"backend {backend} is not run by this executor")
        try:
            _check_deadline(deadline_s)
            specs = build().specs()
            return launcher, tuple(self._checked(backend, spec, index=i) for i, spec in enumerate(specs))
        except ValueError as exc:
            return self._result(agent_pb2.COMMAND_STATUS_REJECTED, str(exc))

    def _checked(self, backend: Backend, spec: BenchmarkSpec, *, index: int) -> BenchmarkSpec:
        """One spec ready to run: its table staged, its environment allowed; ``ValueError`` says why not."""
        if spec.cuda_graph and not backend.runs_nccl:
            raise ValueError(f"cuda_graph: CUDA graphs need the nccl backend; this node runs {backend}")
        if spec.tuner_table:
            if self._tuner_plugin is None:
                raise ValueError("tuner_table: this agent runs no tuner plugin")
            spec = self._tuner_plugin.staged(spec, index=index)
        elif self._tuner_plugin is not None and backend.runs_nccl:
            spec = self._tuner_plugin.recording(spec, index=index)
        self._policy.check(spec.env)
        return spec

    def execute(
        self,
        run: agent_pb2.RunBenchmark,
        *,
        node_name: str,
        backend: Backend,
        deadline_s: float,
        work_dir: Path,
        fault: WorkerFault | None = None,
    ) -> agent_pb2.CommandResult:
        """Run this node's ranks of a benchmark job, spec after spec (each its own run of the launcher, in kept or
        new workers; the first that does not succeed ends the job here). ``fault`` is a test-only hook (see
        worker_config)."""
        prepared = self._prepare(backend, lambda: spec_from_proto(run), deadline_s)
        if isinstance(prepared, agent_pb2.CommandResult):
            return prepared
        launcher, specs = prepared
        if len(specs) == 1:
            return self._run(
                launcher, specs[0], node_name=node_name, deadline_s=deadline_s, work_dir=work_dir, fault=fault
            )
        started = self._monotonic()
        whole: agent_pb2.CommandResult | None = None
        for index, spec in enumerate(specs):
            # The job's deadline covers all its specs: each runs for what is left of it.
            left = max(1.0, deadline_s - (self._monotonic() - started))
            # Each spec's rank directories of its own: with several agents on one work directory, a node that
            # starts a spec must not reset a rank directory another node still uses for the spec before. The
            # kept worker sets stay in the work directory's: the next job's spec of the same environment (the
            # proof's B arm, pair after pair) runs in them.
            result = self._run(
                launcher,
                spec,
                node_name=node_name,
                deadline_s=left,
                work_dir=work_dir,
                fault=fault,
                job_dir_name=f"{spec.job_id}.{index}" if index else "",
            )
            for rank in result.node_benchmark.ranks:
                for row in rank.sizes:
                    row.spec = index
            if whole is None:
                whole = result
            else:
                whole.node_benchmark.ranks.extend(result.node_benchmark.ranks)
                del whole.node_benchmark.rank_status[:]
                whole.node_benchmark.rank_status.extend(result.node_benchmark.rank_status)  # how the last one ended
                whole.status = result.status
                whole.finished_at.CopyFrom(result.finished_at)
            if result.status != agent_pb2.COMMAND_STATUS_SUCCEEDED:
                whole.message = f"spec {index} of {len(specs)}: {result.message}"
                return whole
        assert whole is not None
        whole.message = f"job {specs[0].job_id}: {len(specs)} specs run, each by every local rank"
        return whole

    def _run(
        self,
        launcher: Launcher,
        spec: BenchmarkSpec,
        *,
        node_name: str,
        deadline_s: float,
        work_dir: Path,
        fault: WorkerFault | None,
        job_dir_name: str = "",
    ) -> agent_pb2.CommandResult:
        if not spec.local_slots(node_name):
            return self._result(agent_pb2.COMMAND_STATUS_REJECTED, f"job {spec.job_id} has no rank on node {node_name}")
        try:
            outcome = launcher.run(
                spec,
                node_name=node_name,
                deadline_s=deadline_s,
                work_dir=work_dir,
                fault=fault,
                job_dir_name=job_dir_name,
            )
        except LauncherBusy as exc:
            return self._result(agent_pb2.COMMAND_STATUS_REJECTED, str(exc))
        except JobCancelled as exc:
            return self._result(agent_pb2.COMMAND_STATUS_FAILED, str(exc))
        status, message = _status_of(spec, outcome)
        logger.info("job %s on %s: %s", spec.job_id, node_name, message)
        result = self._result(status, message)
        result.node_benchmark.CopyFrom(
            node_result_to_proto(
                job_id=spec.job_id, node_name=node_name, results=outcome.results, statuses=outcome.statuses
            )
        )
        return result

    def probe(
        self,
        probe: agent_pb2.Probe,
        *,
        node_name: str,
        backend: Backend,
        deadline_s: float,
        work_dir: Path,
    ) -> agent_pb2.CommandResult:
        """Measure latency and one direction's bandwidth between this node and its one peer."""
        launcher = self._launcher(backend)
        if launcher is None:
            return self._result(agent_pb2.COMMAND_STATUS_REJECTED, f"backend {backend} is not run by this executor")
        try:
            _check_deadline(deadline_s)
            specs = probe_specs(probe, one_way=backend.one_way_probes)
        except ValueError as exc:
            return self._result(agent_pb2.COMMAND_STATUS_REJECTED, str(exc))
        started = self._monotonic()
        measured: tuple[BenchmarkSpec, agent_pb2.CommandResult] | None = None
        for spec in specs:
            left = max(1.0, deadline_s - (self._monotonic() - started))
            result = self._run(launcher, spec, node_name=node_name, deadline_s=left, work_dir=work_dir, fault=None)
            if result.status != agent_pb2.COMMAND_STATUS_SUCCEEDED:
                return result
            if len(specs) == 1 or spec.ranks[1].node_name == node_name:
                measured = spec, result  # this node's figures: sendrecv's, or the one-way job it received
        assert measured is not None, "a probe's jobs include one that this node receives"
        spec, result = measured
        sizes = result.node_benchmark.ranks[0].sizes
        latency = next(s for s in sizes if s.bytes == spec.sweep.min_bytes)
        bandwidth = next(s for s in sizes if s.bytes == spec.sweep.max_bytes)
        bandwidth_gbps, latency_us = probe_figures(latency, bandwidth)
        peer = next(p for p in probe.peers if p != node_name)
        out = self._result(agent_pb2.COMMAND_STATUS_SUCCEEDED, result.message)
        out.probe.CopyFrom(
            agent_pb2.ProbeResult(
                probe_id=probe.probe_id,
                node_name=node_name,
                peer=peer,
                bandwidth_gbps=bandwidth_gbps,
                latency_us=latency_us,
            )
        )
        return out


def probe_figures(latency: agent_pb2.SizeResult, bandwidth: agent_pb2.SizeResult) -> tuple[float, float]:
    """``(bandwidth_gbps, latency_us)`` of one probe direction, each from its size's median iteration.

    A probe asks what the link carries, not what the host's scheduler allowed at its worst moment: one
    stalled iteration moves the mean by its whole length over the iteration count, the median not at all.
    A size without a per-iteration median (``p50_us`` 0) keeps its mean.
    """
    bandwidth_gbps = bandwidth.algbw_gbps
    if bandwidth.p50_us > 0:  # algbw is bytes over time: the same bytes over the median's time
        bandwidth_gbps *= bandwidth.time_us / bandwidth.p50_us
    latency_us = latency.p50_us if latency.p50_us > 0 else latency.time_us
    return bandwidth_gbps, latency_us


def _check_deadline(deadline_s: float) -> None:
    if deadline_s > MAX_DEADLINE_S:
        raise ValueError(f"deadline_s must be at most {MAX_DEADLINE_S} s, got {deadline_s:.0f}")


def probe_specs(probe: agent_pb2.Probe, *, one_way: bool) -> tuple[BenchmarkSpec, ...]:
    """The jobs of a probe, at sizes (latency_bytes, message_bytes): one two-rank sendrecv, or
    (``one_way``) a broadcast from ``peers[0]`` and then one from ``peers[1]``, rendezvousing at
    ``peer_rendezvous_host`` on the next port."""
    if len(probe.peers) != 2 or probe.peers[0] == probe.peers[1]:
        raise ValueError(f"peers must name exactly two different nodes, got {list(probe.peers)}")
    latency = probe.latency_bytes or _DEFAULT_LATENCY_BYTES
    message = probe.message_bytes
    if message < 2 * latency or message % latency:
        raise ValueError(
            f"message_bytes ({message}) must be a multiple of latency_bytes ({latency}) and at least twice it"
        )
    if one_way and not probe.peer_rendezvous_host:
        raise ValueError("peer_rendezvous_host is required: gloo times each direction in a job of its own")
    if one_way and probe.rendezvous_port >= 65535:
        raise ValueError(f"rendezvous_port {probe.rendezvous_port}: the reverse direction needs the next port free")

    def job(collective: Collective, ranks: tuple[str, str], host: str, port: int, *, suffix: str) -> BenchmarkSpec:
        return BenchmarkSpec(
            job_id=f"probe-{probe.probe_id}{suffix}",
            collective=collective,
            # step = message/latency makes the sweep exactly (latency, message).
            sweep=SizeSweep(latency, message, message // latency),
            dtype=dtype_named("float32"),
            warmup_iters=probe.warmup_iters,
            iters=probe.iters or DEFAULT_PROBE_ITERS,
            placements=(False,),
            check=True,
            env={},
            world_size=2,
            ranks=(RankSlot(0, ranks[0], 0, 0), RankSlot(1, ranks[1], 0, 0)),
            rendezvous_host=host,
            rendezvous_port=port,
        )

    a, b = probe.peers
    if not one_way:
        return (job(Collective.SENDRECV, (a, b), probe.rendezvous_host, probe.rendezvous_port, suffix=""),)
    return (
        job(Collective.BROADCAST, (a, b), probe.rendezvous_host, probe.rendezvous_port, suffix=_PROBE_JOB_SUFFIXES[0]),
        job(
            Collective.BROADCAST,
            (b, a),
            probe.peer_rendezvous_host,
            probe.rendezvous_port + 1,
            suffix=_PROBE_JOB_SUFFIXES[1],
        ),
    )


def _status_of(spec: BenchmarkSpec, outcome: NodeOutcome) -> tuple[agent_pb2.CommandStatus.ValueType, str]:
    if outcome.cancelled and outcome.failed:
        return agent_pb2.COMMAND_STATUS_FAILED, f"job {spec.job_id} cancelled by the controller: {outcome.cancelled}"
    if outcome.timed_out:
        hung = list(outcome.hung_ranks)
        # Ranks the rendezvous still waited for, as the waiting ranks saw it, plus local ranks that
        # never got as far as contacting it.
        missing = sorted(
            {r for s in outcome.statuses for r in s.waiting_for}
            | {s.rank for s in outcome.statuses if s.phase in ("started", "not_started")}
        )
        return agent_pb2.COMMAND_STATUS_TIMED_OUT, (
            f"job {spec.job_id} timed out: ranks {hung} killed at the deadline; missing at the rendezvous: {missing}"
        )
    failed = [s for s in outcome.statuses if s.outcome is not RankOutcome.FINISHED]
    if failed:
        detail = "; ".join(f"rank {s.rank}: {s.message}" for s in failed)
        return agent_pb2.COMMAND_STATUS_FAILED, f"job {spec.job_id} failed: {detail}"
    wrong = {r.rank: r.wrong for r in outcome.results if r.wrong}
    if wrong:
        return agent_pb2.COMMAND_STATUS_FAILED, f"job {spec.job_id}: data check found wrong elements {wrong}"
    return (
        agent_pb2.COMMAND_STATUS_SUCCEEDED,
        f"job {spec.job_id}: {len(outcome.results)} local rank(s) finished",
    )
