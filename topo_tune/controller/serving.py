"""Serving: the gRPC server (agent, admin and health services), the plaintext health port, the metrics port.

The main server carries the credential, leader-only and request-decoding interceptors and optional TLS. The
health service answers for the process (``""``: liveness, SERVING from start to shutdown) and for the agent
and admin services (readiness: SERVING only while this controller leads). Shutdown: health goes
``NOT_SERVING`` first so load balancers stop sending, then in-flight RPCs get a grace period. Non-goals:
what the services do (``controller/*_service.py``) and when this controller leads (``leadership.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from topo_tune.controller.api.admin import SERVICE_NAME as ADMIN_SERVICE_NAME
from topo_tune.controller.api.admin import AdminServicer
from topo_tune.controller.api.agent import AgentServicer
from topo_tune.controller.api.request_decoding import DecodingInterceptor
from topo_tune.controller.credentials import CredentialInterceptor
from topo_tune.controller.leadership import LeaderOnlyInterceptor
from topo_tune.controller.settings import ControllerSettings
from topo_tune.controller.wiring import Services
from topo_tune.errors import ConfigError
from topo_tune.security.auth import server_credentials
from topo_tune.v1 import admin_pb2_grpc, agent_pb2, agent_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    ADMIN_SERVICE_NAME,
)


class Serving:
    """The listening ports of one controller process; ``port``, ``health_port``, ``metrics_port`` once started."""

    def __init__(self, services: Services, *, settings: ControllerSettings, leading: Callable[[], bool]) -> None:
        self._services = services
        self._settings = settings
        self._leading = leading
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._metrics_server: Any = None

    async def start(self) -> None:
        """Bind and start every port; the agent and admin services are ``NOT_SERVING`` until ``set_leading``."""
        settings, services = self._settings, self._services
        options = [
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            # Agents ping every 30 s to keep NATs and load balancers from dropping idle streams.
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        # In this order: a caller without a credential, or a follower, has nothing deserialized at all.
        interceptors = [
            CredentialInterceptor(services.credentials),
            LeaderOnlyInterceptor(self._leading),
            DecodingInterceptor(),
        ]
        server = grpc.aio.server(interceptors=interceptors, options=options)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(services.hub, services.credentials), server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(
                registry=services.registry,
                commands=services.commands,
                hub=services.hub,
                jobs=services.jobs,
                probes=services.probes,
                spine_oversubscription=settings.spine_oversubscription,
                spine_bandwidth_gbps=settings.spine_bandwidth_gbps,
                rollouts=services.rollouts,
                config_versions=services.config_versions,
                studies=services.studies,
                job_configs=services.job_configs,
                job_comparisons=services.job_comparisons,
                job_timings=services.job_timings,
                drift=services.drift,
                credentials=services.credentials,
                credential_ledger=services.credential_ledger,
            ),
            server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.port = self._bind(server, settings.listen, secure=settings.tls is not None)
        if settings.health_listen:
            self._health_server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
            self.health_port = self._bind(self._health_server, settings.health_listen, secure=False)
            await self._health_server.start()
        await server.start()
        self._server = server
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.set_leading(False)
        if settings.metrics_listen:
            host, _, port = settings.metrics_listen.rpartition(":")
            self._metrics_server, _thread = start_http_server(
                int(port), addr=host.strip("[]"), registry=services.metrics.registry
            )
            self.metrics_port = self._metrics_server.server_port

    async def set_leading(self, leading: bool) -> None:
        """The agent and admin services' health: SERVING only while this controller leads."""
        status = health_pb2.HealthCheckResponse.SERVING if leading else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in SERVICE_NAMES:
            await self.health.set(name, status)

    async def unhealthy(self) -> None:
        """The process is no good (kubelet restarts it)."""
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)

    async def enter_shutdown(self) -> None:
        """Shutdown's first step: NOT_SERVING everywhere, so that load balancers stop sending."""
        await self.health.enter_graceful_shutdown()

    async def drain(self) -> None:
        """In-flight RPCs get the grace period; then the main server is closed."""
        if self._server is not None:
            await self._server.stop(self._settings.shutdown_grace_s)
            self._server = None

    async def close(self) -> None:
        """Shutdown's last step: the health and metrics ports close."""
        if self._health_server is not None:
            await self._health_server.stop(0)
            self._health_server = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None

    def _bind(self, server: grpc.aio.Server, address: str, *, secure: bool) -> int:
        try:
            if secure and self._settings.tls is not None:
                port = server.add_secure_port(address, server_credentials(self._settings.tls))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as error:
            raise ConfigError("--listen", f"cannot listen on {address}: {error}") from None
        if port == 0:
            raise ConfigError("--listen", f"cannot listen on {address}")
        return port
