"""Wiring and lifecycle of the controller daemon: start, serve, shut down gracefully.

Start-up: migrate the database, load the node registry, register the periodic jobs, start the gRPC
server (agent + admin + health services, the credential interceptor, optional TLS), the optional plaintext
health port and the Prometheus endpoint. Shutdown (SIGTERM): health goes ``NOT_SERVING`` first so load
balancers stop sending, sessions are closed so agents reconnect elsewhere, in-flight RPCs get a grace
period, the last heartbeats are flushed, the database is closed.

A rollout is driven by a periodic reconcile pass (and one right after each admin change).
Periodic jobs run in APScheduler 3.x (in-memory job store; the schedules come from settings, so they are
simply registered again at each start-up): the expiry sweep, the heartbeat flush, the rollout reconcile
pass, job-pin retention, the drift check (``drift.py``) and the retention of old results (``retention.py``).

Leader-only work — migrating and loading the database, the periodic jobs, agent sessions and admin calls —
runs while this controller leads. Alone (the default) it leads from start-up to shutdown. With leader
election (Kubernetes, several replicas) it leads while it holds the Lease: on gaining it the state is
reloaded from the database (level-triggered: the previous leader changed it), on losing it the jobs stop,
sessions close and the agent/admin health goes ``NOT_SERVING`` at once; every periodic job checks the
leadership term (the fence) before it writes, because Lease-based election cannot promise that a paused
ex-leader notices in time. For a process paused after that check, the database fences too: a new term
claims its epoch there before loading anything, and from then on every commit checks it (``db/fence.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import grpc.aio
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from topo_tune.auth import server_credentials
from topo_tune.config_version import TUNER_TABLE
from topo_tune.controller.admin_service import AdminServicer
from topo_tune.controller.agent_service import AgentServicer
from topo_tune.controller.commands import CommandBook
from topo_tune.controller.credentials import CredentialInterceptor, Credentials
from topo_tune.controller.db.database import Database
from topo_tune.controller.drift import DriftChecker
from topo_tune.controller.jobs import BenchmarkJobs, JobSettings
from topo_tune.controller.leadership import LeaderOnlyInterceptor
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.nodes import NodeRegistry, TopologyChange
from topo_tune.controller.probes import Probes
from topo_tune.controller.retention import Retention, RetentionReport
from topo_tune.controller.rollout.engine import RolloutEngine
from topo_tune.controller.rollout.job_pins import JobResolver
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.controller.rollout.verification import BenchmarkVerifier
from topo_tune.controller.sessions import SessionHub
from topo_tune.controller.settings import ControllerSettings
from topo_tune.controller.studies import Studies
from topo_tune.errors import ConfigError, FencedError, StaleTermError
from topo_tune.kube.idleness import AssumeIdle, NodeIdleness, busy_nodes
from topo_tune.kube.leader_election import LeaderElector, LeadershipTerm
from topo_tune.kube.serving_label import ServingLabel
from topo_tune.plugin.table import parse_tuner_table
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
)


def _wall_clock() -> datetime:
    return datetime.now(UTC)


async def _ends_quietly_on_shutdown(job: Callable[[], Awaitable[object]], job_id: str) -> None:
    """Run one periodic job. The scheduler's shutdown (stop, or no longer leading) cancels a run in flight:
    every periodic job is level-triggered (the next pass or the next leader does it again), so that run ends
    with a log line, not the traceback APScheduler would print for a cancelled job."""
    try:
        await job()
    except asyncio.CancelledError:
        logger.info("periodic job %s cut short by shutdown", job_id)


class Controller:
    """One controller process's services and state."""

    def __init__(self, settings: ControllerSettings, *, idleness: NodeIdleness | None = None) -> None:
        if not settings.token:
            raise ConfigError("--token-file", "the controller needs a token: --token-file FILE or TOPO_TUNE_TOKEN")
        self.settings = settings
        self.controller_id = settings.controller_id or uuid.uuid4().hex[:12]
        self.credentials = Credentials(settings.token)
        self.metrics = ControllerMetrics()
        self.db = Database(settings.database_url)
        self.registry = NodeRegistry(
            db=self.db,
            expiry_s=settings.heartbeat_expiry_s,
            clock=time.monotonic,
            wall_clock=_wall_clock,
            rack_of=dict(settings.rack_of),
        )
        self.commands = CommandBook(
            db=self.db,
            wall_clock=_wall_clock,
            ignored_results_kept=settings.retention.ignored_results_per_node,
        )
        self.hub = SessionHub(
            registry=self.registry,
            commands=self.commands,
            metrics=self.metrics,
            heartbeat_interval_ms=int(settings.heartbeat_interval_s * 1000),
            controller_id=self.controller_id,
            fanout_window=settings.fanout_window,
        )
        self.jobs = BenchmarkJobs(
            db=self.db,
            registry=self.registry,
            commands=self.commands,
            deliver=self.hub.deliver_new,
            wall_clock=_wall_clock,
            settings=JobSettings(
                spine_oversubscription=settings.spine_oversubscription,
                spine_ecmp_paths=settings.spine_ecmp_paths,
                result_grace_s=settings.benchmark_result_grace_s,
            ),
        )
        self.hub.result_listeners.append(self.jobs.on_result)
        self.probes = Probes(
            db=self.db,
            registry=self.registry,
            commands=self.commands,
            deliver=self.hub.deliver_new,
            wall_clock=_wall_clock,
        )
        self.hub.result_listeners.append(self.probes.on_result)
        self.jobs.busy_reasons = self._busy_reasons
        self.rollout_store = RolloutStore(db=self.db, wall_clock=_wall_clock)
        self.config_versions = self.rollout_store.versions
        self.studies = Studies(
            db=self.db,
            registry=self.registry,
            jobs=self.jobs,
            probes=self.probes,
            config_versions=self.config_versions,
            wall_clock=_wall_clock,
            output_root=settings.studies_dir,
            rack_of=dict(settings.rack_of),
            spine=(settings.spine_oversubscription, settings.spine_bandwidth_gbps),
        )
        verifier = BenchmarkVerifier(jobs=self.jobs, config_dir=settings.agent_config_dir, tables=self._tuner_table)
        self.rollouts = RolloutEngine(
            store=self.rollout_store,
            registry=self.registry,
            commands=self.commands,
            hub=self.hub,
            verifier=verifier,
            wall_clock=_wall_clock,
            background_gates=True,
            gate_defaults=settings.rollout_gate,
            threshold_defaults=settings.rollout_thresholds,
        )
        self.drift = DriftChecker(
            db=self.db,
            registry=self.registry,
            rollouts=self.rollout_store,
            verifier=verifier,
            studies=self.studies,
            metrics=self.metrics,
            wall_clock=_wall_clock,
            settings=settings.drift,
            idle=self._idle_nodes,
        )
        self.registry.topology_listeners.append(self._on_topology_change)
        self.retention = Retention(
            db=self.db, wall_clock=_wall_clock, settings=settings.retention, metrics=self.metrics
        )
        self.job_configs = JobResolver(self.rollout_store)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._metrics_server: Any = None
        self._scheduler: AsyncIOScheduler | None = None
        self.idleness: NodeIdleness = idleness or AssumeIdle()
        """Ask before sending benchmark work to a node (Kubernetes: cordoned, or no GPU pods)."""
        self._idleness_injected = idleness is not None
        self._elector: LeaderElector | None = None
        self._election: asyncio.Task[None] | None = None
        self._election_stop = asyncio.Event()
        self._term: LeadershipTerm | None = None
        self._serving_label: ServingLabel | None = None
        """With leader election in a pod: the label that routes the Service to the leader."""
        self._labelling: asyncio.Task[None] | None = None

    async def _tuner_table(self, version: str) -> str:
        """``version``'s tuner-plugin table when it has rows, for its gate jobs; else ""."""
        table = (await self.config_versions.files(version)).get(TUNER_TABLE, "")
        return table if parse_tuner_table(table, source=f"{version}/{TUNER_TABLE}") else ""

    async def _busy_reasons(self, nodes: list[str]) -> list[str]:
        return [f"{verdict.node_name}: {verdict.reason}" for verdict in await busy_nodes(self.idleness, nodes)]

    async def _idle_nodes(self, nodes: list[str]) -> list[str]:
        busy = {verdict.node_name for verdict in await busy_nodes(self.idleness, nodes)}
        return [n for n in nodes if n not in busy]

    async def _on_topology_change(self, change: TopologyChange) -> None:
        if not self.leading:
            return
        try:
            await self.drift.on_topology_change(
                change.node_name, before=change.before, after=change.after, version=change.applied_config_version
            )
        except Exception:
            # The registration itself is committed (with its event); the agent's session must not fail over this.
            logger.exception("recording a topology change failed", extra={"node": change.node_name})

    @property
    def leading(self) -> bool:
        """True while this controller may do leader-only work (always, without leader election)."""
        return self._holds(self._term)

    def _holds(self, term: LeadershipTerm | None) -> bool:
        if term is None or term is not self._term:
            return False
        return self._elector is None or self._elector.holds(term)

    def job_ids(self) -> list[str]:
        """The periodic jobs scheduled now (none on a standby)."""
        return sorted(job.id for job in self._scheduler.get_jobs()) if self._scheduler else []

    async def start(self) -> None:
        if self.settings.kubernetes is not None:
            self._connect_kubernetes()
        elif self.settings.leader_election is not None:
            raise ConfigError("--leader-election", "needs the Kubernetes API: run the controller in a pod")
        elif self.settings.agent_service_account:
            raise ConfigError("--agent-service-account", "needs the Kubernetes API: run the controller in a pod")
        if self._elector is None:
            await self._load_state()  # before binding: a bad database fails start-up before anyone connects
        options = [
            ("grpc.max_receive_message_length", self.settings.max_message_bytes),
            ("grpc.max_send_message_length", self.settings.max_message_bytes),
            # Agents ping every 30 s to keep NATs and load balancers from dropping idle streams.
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        interceptors = [CredentialInterceptor(self.credentials), LeaderOnlyInterceptor(lambda: self.leading)]
        server = grpc.aio.server(interceptors=interceptors, options=options)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(self.hub, self.credentials), server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(
                registry=self.registry,
                commands=self.commands,
                hub=self.hub,
                jobs=self.jobs,
                probes=self.probes,
                spine_oversubscription=self.settings.spine_oversubscription,
                spine_bandwidth_gbps=self.settings.spine_bandwidth_gbps,
                rollouts=self.rollouts,
                config_versions=self.config_versions,
                studies=self.studies,
                job_configs=self.job_configs,
                drift=self.drift,
                credentials=self.credentials,
            ),
            server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.port = self._bind(server, self.settings.listen, secure=self.settings.tls is not None)
        if self.settings.health_listen:
            self._health_server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
            self.health_port = self._bind(self._health_server, self.settings.health_listen, secure=False)
            await self._health_server.start()
        await server.start()
        self._server = server
        # "" is the process (liveness); the services are SERVING only while this controller leads (readiness).
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        for name in SERVICE_NAMES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.settings.metrics_listen:
            host, _, port = self.settings.metrics_listen.rpartition(":")
            self._metrics_server, _thread = start_http_server(
                int(port), addr=host.strip("[]"), registry=self.metrics.registry
            )
            self.metrics_port = self._metrics_server.server_port
        if self._elector is None:
            await self._begin_leader_work(LeadershipTerm(self.controller_id, term=1, transitions=0))
        else:
            self._election_stop = asyncio.Event()
            self._election = asyncio.create_task(self._campaign(self._elector), name="leader-election")
            if self._serving_label is not None:
                period = self._elector.settings.retry_period_s
                self._labelling = asyncio.create_task(
                    self._serving_label.run(self._election_stop, period), name="leader-label"
                )
        logger.info("controller serving", extra={"port": self.port, "controller": self.controller_id})

    def _connect_kubernetes(self) -> None:
        # Imported here: only Kubernetes mode loads the kubernetes client.
        from topo_tune.kube.api import KubeApi  # noqa: PLC0415
        from topo_tune.kube.idleness import KubernetesNodeIdleness  # noqa: PLC0415

        assert self.settings.kubernetes is not None
        api = KubeApi.connect(self.settings.kubernetes)
        if self.settings.agent_service_account:
            from topo_tune.kube.agent_identity import AgentTokenReviewer  # noqa: PLC0415

            reviewer = AgentTokenReviewer(
                lambda token, audiences: api.review_token(token, audiences=audiences),
                service_account=self.settings.agent_service_account,
            )
            self.credentials.review_agent = reviewer.node_of
        if not self._idleness_injected:
            self.idleness = KubernetesNodeIdleness(api)
        election = self.settings.leader_election
        if election is not None:
            self._elector = LeaderElector(
                api=api,
                settings=election,
                on_started_leading=self._start_leading,
                on_stopped_leading=self._stop_leading,
            )
            if election.pod_name:
                self._serving_label = ServingLabel(
                    api=api, namespace=election.namespace, pod_name=election.pod_name, leading=lambda: self.leading
                )

    async def _campaign(self, elector: LeaderElector) -> None:
        try:
            await elector.run(self._election_stop)
        except Exception:
            # Leader work could not start (e.g. the database is unreachable): report the process unhealthy
            # so that kubelet restarts it, rather than idling as a standby that can never lead.
            logger.exception("leader election ended with an error", extra={"controller": self.controller_id})
            await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _load_state(self, term: LeadershipTerm | None = None) -> None:
        """Migrate, claim ``term``'s epoch (with leader election), then load what the database holds."""
        await asyncio.to_thread(self.db.migrate)
        if term is not None:
            try:
                election = self.settings.leader_election
                await asyncio.to_thread(
                    self.db.claim_epoch,
                    term.transitions,
                    holder=term.identity,
                    at=_wall_clock(),
                    idle_timeout_s=election.fence_idle_timeout_s if election else 5.0,
                )
            except FencedError as error:
                raise StaleTermError(epoch=term.transitions, newer=error.current) from error
        known = await self.registry.load()
        await self.probes.recover()
        await self.jobs.recover()
        await self.studies.recover()
        await self.drift.recover()
        logger.info("database ready", extra={"nodes": known, "url": self.db.url.render_as_string()})

    async def _start_leading(self, term: LeadershipTerm) -> None:
        """On gaining the Lease: reload the state the previous leader left, then begin leader-only work."""
        await self._load_state(term)
        await self._begin_leader_work(term)

    async def _begin_leader_work(self, term: LeadershipTerm) -> None:
        """Schedule the jobs, accept agents and admins."""
        self._term = term
        self._start_jobs()
        for name in SERVICE_NAMES:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.metrics.leader.set(1)
        logger.info("leading", extra={"controller": self.controller_id, "term": term.term})

    async def _stop_leading(self, term: LeadershipTerm) -> None:
        """End leader-only work at once. Pending heartbeats are written only if the term still holds."""
        still_holds = self._holds(term)
        self._term = None  # the fence: from here on no job and no call does leader-only work
        self.metrics.leader.set(0)
        for name in SERVICE_NAMES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        await self.rollouts.close()  # a gate still measuring is rerun by the next leader
        await self.drift.close()  # a drift check still measuring is marked failed by the next leader
        self.hub.close_all("this controller is no longer the leader")
        if still_holds:
            await self.registry.flush()
        logger.info("no longer leading", extra={"controller": self.controller_id, "term": term.term})

    def _bind(self, server: grpc.aio.Server, address: str, *, secure: bool) -> int:
        try:
            if secure and self.settings.tls is not None:
                port = server.add_secure_port(address, server_credentials(self.settings.tls))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as error:
            raise ConfigError("--listen", f"cannot listen on {address}: {error}") from None
        if port == 0:
            raise ConfigError("--listen", f"cannot listen on {address}")
        return port

    def _start_jobs(self) -> None:
        scheduler = AsyncIOScheduler(timezone=UTC)

        def every(seconds: float, job: Callable[[], Awaitable[object]], job_id: str) -> None:
            # One run at a time; runs missed while one was busy collapse into one.
            scheduler.add_job(
                _ends_quietly_on_shutdown,
                "interval",
                args=(job, job_id),
                seconds=seconds,
                id=job_id,
                replace_existing=True,
                max_instances=1,
                coalesce=True,
            )

        every(max(0.05, min(1.0, self.settings.heartbeat_expiry_s / 4)), self.sweep, "expiry-sweep")
        every(max(0.1, min(5.0, self.settings.heartbeat_interval_s)), self.flush, "heartbeat-flush")
        every(self.settings.rollout_interval_s, self.reconcile_rollouts, "rollout-reconcile")
        every(3600.0, self.prune_job_pins, "job-pin-retention")
        if self.settings.drift.interval_s > 0:
            every(self.settings.drift.interval_s, self.drift_check, "drift-check")
        if self.settings.retention.max_age_s > 0:
            every(self.settings.retention.interval_s, self.retain, "retention")
        scheduler.start()
        self._scheduler = scheduler

    async def drift_check(self) -> admin_pb2.DriftCheck | None:
        """One drift check of the active config version (None on a standby); an error is logged, not raised."""
        if not self.leading:
            return None
        try:
            return await self.drift.check()
        except Exception:
            logger.exception("drift check failed; the next one runs at the next interval")
            return None

    async def retain(self) -> RetentionReport | None:
        """One retention pass (None on a standby)."""
        if not self.leading:
            return None
        return await self.retention.run()

    async def prune_job_pins(self) -> int:
        if not self.leading:
            return 0
        cutoff = _wall_clock() - timedelta(days=self.settings.job_pin_retention_days)
        pruned = await self.rollout_store.prune_pins(older_than=cutoff)
        if pruned:
            logger.info("forgot %d job pins older than %s", pruned, cutoff.isoformat())
        return pruned

    async def reconcile_rollouts(self) -> None:
        """One level-triggered pass over the active rollout; an error is logged and retried next tick."""
        if not self.leading:
            return
        try:
            await self.rollouts.reconcile()
        except Exception:
            logger.exception("rollout reconcile pass failed; retrying at the next tick")

    async def sweep(self) -> None:
        if not self.leading:
            logger.warning("expiry sweep skipped: not the leader", extra={"controller": self.controller_id})
            return
        with self.metrics.db_seconds.time():
            await self.registry.sweep()
            await self.jobs.sweep()
        for state, count in self.registry.counts().items():
            self.metrics.nodes.labels(state=state.value).set(count)
        self.metrics.nodes_config_damaged.set(self.registry.damaged())

    async def flush(self) -> None:
        if not self.leading:
            logger.warning("heartbeat flush skipped: not the leader", extra={"controller": self.controller_id})
            return
        await self.registry.flush()

    async def stop(self) -> None:
        """Graceful shutdown: NOT_SERVING, close sessions, drain RPCs, stop leading (flush, release), close."""
        await self.health.enter_graceful_shutdown()
        self.hub.close_all("controller shutting down")
        await self.probes.close()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_s)
            self._server = None
        try:
            if self._election is not None:
                self._election_stop.set()  # the elector stops leading, then releases the Lease
                await self._election
                self._election = None
                await self._unlabel()
            elif self._term is not None:
                await self._stop_leading(self._term)
        finally:
            if self._health_server is not None:
                await self._health_server.stop(0)
                self._health_server = None
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
                self._metrics_server.server_close()
                self._metrics_server = None
            await asyncio.to_thread(self.db.close)
        logger.info("controller stopped", extra={"controller": self.controller_id})

    async def _unlabel(self) -> None:
        """After the last term ended: the label leaves this pod before the process does."""
        if self._labelling is not None:
            await self._labelling
            self._labelling = None
        if self._serving_label is not None:
            await self._serving_label.reconcile()

    async def serve(self, stop: asyncio.Event) -> None:
        """Start, run until ``stop`` is set, then shut down gracefully."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()
