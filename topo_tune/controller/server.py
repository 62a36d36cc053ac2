"""The controller daemon: one process's start, serve and graceful shutdown.

Start-up: connect to the Kubernetes API when in a pod, build the services (``wiring.py``), migrate and load
the database (alone; with leader election that waits for the Lease, ``leadership.py``), start serving
(``serving.py``), then lead: the periodic jobs (``schedule.py``) run, agents and admins are accepted.
Shutdown (SIGTERM): health goes ``NOT_SERVING`` first so load balancers stop sending, sessions are closed
so agents reconnect elsewhere, in-flight RPCs get a grace period, leadership ends (the last heartbeats are
flushed, the Lease released), the database is closed. A rollout is driven by the periodic reconcile pass
(and one right after each admin change).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from topo_tune.controller.api.in_process import InProcessPort
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.db.database import Database
from topo_tune.controller.leadership import Leadership
from topo_tune.controller.rollout.job_pins import JobNodesLookup
from topo_tune.controller.schedule import Schedule
from topo_tune.controller.serving import Serving
from topo_tune.controller.settings import ControllerSettings
from topo_tune.controller.studies import StudyPass
from topo_tune.controller.wiring import Services
from topo_tune.errors import ConfigError
from topo_tune.kube.idleness import AssumeIdle, NodeIdleness
from topo_tune.kube.leader_election import LeadershipTerm

if TYPE_CHECKING:
    from topo_tune.kube.api import KubeApi

logger = logging.getLogger(__name__)

AgentReview = Callable[[bytes], Awaitable[str | None]]
"""An agent's service-account token → its node name, or None when the API does not vouch for it."""


class Controller:
    """One controller process: its services, leadership, schedule and ports."""

    def __init__(
        self,
        settings: ControllerSettings,
        *,
        idleness: NodeIdleness | None = None,
        study_pass: StudyPass[InProcessPort] | None = None,
    ) -> None:
        """``study_pass``: the pass a study runs, from the command that serves this controller (without it,
        ``study start`` is refused: a controller built to test other services)."""
        if not settings.token:
            raise ConfigError("--token-file", "the controller needs a token: --token-file FILE or TOPO_TUNE_TOKEN")
        self.settings = settings
        self.controller_id = settings.controller_id or uuid.uuid4().hex[:12]
        api = _kubernetes(settings)
        self.db = Database(settings.database_url)
        self.leadership = Leadership(
            controller_id=self.controller_id, db=self.db, work=self, election=settings.leader_election, api=api
        )
        self.services = Services(
            settings,
            controller_id=self.controller_id,
            db=self.db,
            credentials=Credentials(settings.token, review_agent=_agent_reviewer(settings, api)),
            idleness=idleness or _idleness(api),
            leading=lambda: self.leadership.leading,
            job_nodes=_job_nodes(api),
            study_pass=study_pass,
        )
        services = self.services
        # The services by name, for the CLI, the demo and tests.
        self.credentials, self.metrics, self.idleness = services.credentials, services.metrics, services.idleness
        self.registry, self.commands, self.hub = services.registry, services.commands, services.hub
        self.jobs, self.probes, self.studies = services.jobs, services.probes, services.studies
        self.rollout_store, self.config_versions = services.rollout_store, services.config_versions
        self.rollouts, self.drift, self.retention = services.rollouts, services.drift, services.retention
        self.job_configs = services.job_configs
        self.schedule = Schedule(services, settings=settings, leading=lambda: self.leadership.leading)
        self.serving = Serving(services, settings=settings, leading=lambda: self.leadership.leading)

    @property
    def leading(self) -> bool:
        """True while this controller may do leader-only work (always, without leader election)."""
        return self.leadership.leading

    @property
    def port(self) -> int:
        """The gRPC port (agent, admin and health services), once started."""
        return self.serving.port

    @property
    def health_port(self) -> int:
        return self.serving.health_port

    @property
    def metrics_port(self) -> int:
        return self.serving.metrics_port

    async def start(self) -> None:
        await self.leadership.prepare()  # alone: before binding, a bad database fails start-up before anyone connects
        await self.serving.start()
        await self.leadership.start()
        logger.info("controller serving", extra={"port": self.port, "controller": self.controller_id})

    async def stop(self) -> None:
        """Graceful shutdown: NOT_SERVING, close sessions, drain RPCs, stop leading (flush, release), close."""
        await self.serving.enter_shutdown()
        self.hub.close_all("controller shutting down")
        self.services.changes.close("the controller is shutting down")
        await self.probes.close()
        await self.serving.drain()
        try:
            await self.leadership.stop()
        finally:
            await self.serving.close()
            await asyncio.to_thread(self.db.close)
        logger.info("controller stopped", extra={"controller": self.controller_id})

    async def serve(self, stop: asyncio.Event) -> None:
        """Start, run until ``stop`` is set, then shut down gracefully."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    # Leader work (``leadership.LeaderWork``): what a term starts and ends.

    async def load_state(self) -> None:
        known = await self.services.load()
        logger.info("database ready", extra={"nodes": known, "url": self.db.url.render_as_string()})

    async def begin_leading(self, term: LeadershipTerm) -> None:
        self.schedule.start()
        await self.serving.set_leading(True)
        self.metrics.leader.set(1)

    async def end_leading(self, term: LeadershipTerm, *, still_holds: bool) -> None:
        self.metrics.leader.set(0)
        await self.serving.set_leading(False)
        self.schedule.stop()
        await self.rollouts.close()  # a gate still measuring is rerun by the next leader
        await self.drift.close()  # a drift check still measuring is marked failed by the next leader
        self.hub.close_all("this controller is no longer the leader")
        self.services.changes.close("this controller is no longer the leader")
        if still_holds:
            await self.registry.flush()

    async def cannot_lead(self) -> None:
        await self.serving.unhealthy()


def _kubernetes(settings: ControllerSettings) -> KubeApi | None:
    """The Kubernetes API client in a pod; the settings that need it are refused outside one."""
    if settings.kubernetes is None:
        if settings.leader_election is not None:
            raise ConfigError("--leader-election", "needs the Kubernetes API: run the controller in a pod")
        if settings.agent_service_account:
            raise ConfigError("--agent-service-account", "needs the Kubernetes API: run the controller in a pod")
        return None
    # Imported here: only Kubernetes mode loads the kubernetes client.
    from topo_tune.kube.api import KubeApi  # noqa: PLC0415

    return KubeApi.connect(settings.kubernetes)


def _agent_reviewer(settings: ControllerSettings, api: KubeApi | None) -> AgentReview | None:
    """With ``--agent-service-account``: agents may present their service-account token, reviewed by the API."""
    if api is None or not settings.agent_service_account:
        return None
    from topo_tune.kube.agent_identity import AgentTokenReviewer  # noqa: PLC0415

    reviewer = AgentTokenReviewer(
        lambda token, audiences: api.review_token(token, audiences=audiences),
        service_account=settings.agent_service_account,
    )
    return reviewer.node_of


def _idleness(api: KubeApi | None) -> NodeIdleness:
    if api is None:
        return AssumeIdle()
    from topo_tune.kube.idleness import KubernetesNodeIdleness  # noqa: PLC0415

    return KubernetesNodeIdleness(api)


def _job_nodes(api: KubeApi | None) -> JobNodesLookup | None:
    """In Kubernetes mode: a job that names no nodes is looked up by its Job's or JobSet's uid."""
    if api is None:
        return None
    from topo_tune.kube.job_nodes import KubeJobNodes  # noqa: PLC0415

    lookup = KubeJobNodes(api)
    return lambda uid, wait_s: lookup(uid, wait_s=wait_s)
