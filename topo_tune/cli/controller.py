"""``topo-tune controller serve``: the controller daemon."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import uuid
from pathlib import Path

import click

from topo_tune.cli.connection import resolve_token, token_options
from topo_tune.cli.output import emit_line
from topo_tune.cli.setting_options import setting_option
from topo_tune.cli.study_pass import InitPass
from topo_tune.config.checks import overridden
from topo_tune.config.cluster import (
    ClusterConfig,
    ControllerConfig,
    DriftConfig,
    RetentionConfig,
    RolloutConfig,
    load_cluster_config,
    parse_cluster_config,
)
from topo_tune.controller.settings import ControllerSettings
from topo_tune.errors import ConfigError
from topo_tune.kube.environment import KubeEnvironment, detect_in_cluster
from topo_tune.kube.leader_election import LeaderElectionSettings
from topo_tune.security.auth import TlsFiles

_PATH = click.Path(path_type=Path, dir_okay=False)


@click.group()
def controller() -> None:
    """Run the controller daemon."""


@controller.command()
@click.option("--config", "config_file", type=_PATH, help="cluster.yaml; its `controller:` section and racks.")
@setting_option(ControllerConfig, "listen", "--listen", metavar="HOST:PORT", key="controller")
@setting_option(ControllerConfig, "database", "--database", key="controller", envvar="TOPO_TUNE_DATABASE_URL")
@setting_option(ControllerConfig, "metrics_listen", "--metrics-listen", metavar="HOST:PORT", key="controller")
@setting_option(ControllerConfig, "health_listen", "--health-listen", metavar="HOST:PORT", key="controller")
@setting_option(ControllerConfig, "heartbeat_interval", "--heartbeat-interval", key="controller")
@setting_option(ControllerConfig, "heartbeat_expiry", "--heartbeat-expiry", key="controller")
@token_options
@click.option("--tls-cert", type=_PATH, help="Server certificate (enables TLS).")
@click.option("--tls-key", type=_PATH, help="Server key.")
@click.option("--tls-client-ca", type=_PATH, help="CA for client certificates (enables mTLS).")
@click.option(
    "--agent-service-account",
    metavar="NAMESPACE:NAME",
    default="",
    envvar="TOPO_TUNE_AGENT_SERVICE_ACCOUNT",
    help="In Kubernetes: accept an agent pod's projected token (audience topo-tune) of this service account as "
    "the credential of the node TokenReview names [$TOPO_TUNE_AGENT_SERVICE_ACCOUNT].",
)
@click.option(
    "--leader-election/--no-leader-election",
    envvar="TOPO_TUNE_LEADER_ELECTION",
    default=False,
    help="Several replicas in Kubernetes: only the holder of a Lease acts [$TOPO_TUNE_LEADER_ELECTION].",
)
@click.option(
    "--lease-namespace",
    envvar="TOPO_TUNE_LEASE_NAMESPACE",
    help="Namespace of the Lease [$TOPO_TUNE_LEASE_NAMESPACE, else the pod's own].",
)
@click.option(
    "--lease-name",
    envvar="TOPO_TUNE_LEASE_NAME",
    default="topo-tune-controller",
    show_default=True,
    help="Name of the Lease [$TOPO_TUNE_LEASE_NAME].",
)
@click.option(
    "--lease-duration", type=click.IntRange(min=1), default=15, show_default=True, help="Seconds before takeover."
)
@click.option(
    "--renew-deadline", type=float, default=10.0, show_default=True, help="Seconds a leader may fail to renew."
)
@click.option("--retry-period", type=float, default=2.0, show_default=True, help="Seconds between election rounds.")
@click.option(
    "--fence-idle-timeout",
    type=float,
    envvar="TOPO_TUNE_FENCE_IDLE_TIMEOUT",
    default=5.0,
    show_default=True,
    help="PostgreSQL with leader election: seconds a leader's transaction may stay idle between the database "
    "fence's check and its commit (a frozen process) before the server drops it; a new leader waits at most "
    "this long to take over [$TOPO_TUNE_FENCE_IDLE_TIMEOUT].",
)
@click.option(
    "--pod-name",
    envvar="TOPO_TUNE_POD_NAME",
    default="",
    help="This controller's pod: labelled topo-tune.io/leader=true while it leads, for the Service to select "
    "[$TOPO_TUNE_POD_NAME].",
)
@setting_option(DriftConfig, "interval", "--drift-interval", key="controller.drift", off="0")
@setting_option(DriftConfig, "threshold", "--drift-threshold", key="controller.drift")
@setting_option(DriftConfig, "sample_nodes", "--drift-sample-nodes", key="controller.drift")
@setting_option(DriftConfig, "open_study", "--drift-open-study", key="controller.drift")
@setting_option(RetentionConfig, "max_age", "--retention-max-age", key="controller.retention", off="0")
@setting_option(RolloutConfig, "agent_config_dir", "--agent-config-dir", key="rollout", metavar="DIR")
def serve(
    config_file: Path | None,
    listen: str | None,
    database: str | None,
    metrics_listen: str | None,
    health_listen: str | None,
    heartbeat_interval: float | None,
    heartbeat_expiry: float | None,
    token_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    agent_service_account: str,
    leader_election: bool,
    lease_namespace: str | None,
    lease_name: str,
    lease_duration: int,
    renew_deadline: float,
    retry_period: float,
    fence_idle_timeout: float,
    pod_name: str,
    drift_interval: float | None,
    drift_threshold: float | None,
    drift_sample_nodes: int | None,
    drift_open_study: bool | None,
    retention_max_age: float | None,
    agent_config_dir: str | None,
) -> None:
    """Serve the agent and admin gRPC services until SIGTERM or Ctrl-C.

    Flags override cluster.yaml. The token comes from --token-file, else $TOPO_TUNE_TOKEN, else the file
    controller.tokenFile names; admins present the same one, agents a credential issued with it.

    \b
    Example:
      TOPO_TUNE_TOKEN=$(cat token) topo-tune controller serve --config cluster.yaml \\
          --listen 0.0.0.0:50051 --metrics-listen 0.0.0.0:9464

    In a Kubernetes pod the controller uses the API (service account) to tell idle GPU nodes from busy
    ones; with --leader-election only the Lease holder serves agents and admins and runs the periodic jobs,
    and the others report NOT_SERVING for those services.

    The leader re-measures the active config version now and then (--drift-interval) on a few idle nodes
    and records a drift event when its bus bandwidth fell (`topo-tune admin drift list`); it deletes
    results older than --retention-max-age, keeping those rollouts and chosen study trials refer to.
    """
    cluster: ClusterConfig = (
        load_cluster_config(config_file) if config_file else parse_cluster_config({"apiVersion": "topo-tune/v1"})
    )
    section = overridden(
        cluster.controller,
        _given(
            listen=listen,
            database=database,
            metrics_listen=metrics_listen,
            health_listen=health_listen,
            heartbeat_interval=heartbeat_interval,
            heartbeat_expiry=heartbeat_expiry,
        ),
        where="controller",
    )
    tls = None
    if tls_cert or tls_key or section.tls:
        tls = TlsFiles(
            cert=tls_cert or (Path(section.tls.cert_file) if section.tls else None),
            key=tls_key or (Path(section.tls.key_file) if section.tls else None),
            ca=tls_client_ca
            or (Path(section.tls.client_ca_file) if section.tls and section.tls.client_ca_file else None),
        )
    kubernetes = detect_in_cluster(os.environ)
    settings = ControllerSettings(
        listen=section.listen,
        database_url=section.database,
        token=resolve_token(
            token_file,
            configured=Path(section.token_file) if section.token_file else None,
            configured_as=f"controller.tokenFile in {config_file}",
        ),
        tls=tls,
        metrics_listen=section.metrics_listen,
        health_listen=section.health_listen,
        heartbeat_interval_s=section.heartbeat_interval,
        heartbeat_expiry_s=section.heartbeat_expiry,
        rack_of=cluster.rack_of(),
        spine_oversubscription=cluster.spine.oversubscription if cluster.spine else None,
        spine_bandwidth_gbps=cluster.spine.bandwidth_gbps if cluster.spine else None,
        spine_ecmp_paths=cluster.spine.ecmp_paths if cluster.spine else 1,
        drift=overridden(
            section.drift,
            _given(
                **_turned_on_or_off("interval", drift_interval),
                threshold=drift_threshold,
                sample_nodes=drift_sample_nodes,
                open_study=drift_open_study,
            ),
            where="controller.drift",
        ),
        retention=overridden(
            section.retention, _given(**_turned_on_or_off("max_age", retention_max_age)), where="controller.retention"
        ),
        job_caps=section.job_caps,
        learning=cluster.learning,
        rollout_gate=cluster.rollout.gate,
        rollout_thresholds=cluster.rollout.thresholds,
        agent_config_dir=Path(agent_config_dir or cluster.rollout.agent_config_dir).absolute(),
        kubernetes=kubernetes,
        agent_service_account=_service_account(agent_service_account),
        leader_election=_leader_election(
            kubernetes,
            enabled=leader_election,
            namespace=lease_namespace,
            lease_name=lease_name,
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
            fence_idle_timeout=fence_idle_timeout,
            pod_name=pod_name,
        ),
    )
    asyncio.run(_serve(settings))


def _given(**flags: object) -> dict[str, object]:
    """The flags given (None: not given), to apply over cluster.yaml's section."""
    return {name: value for name, value in flags.items() if value is not None}


def _turned_on_or_off(name: str, value: float | None) -> dict[str, object]:
    """A duration flag of a periodic pass: 0 turns the pass off, another value sets it and turns it on."""
    if value is None:
        return {}
    return {"enabled": False} if value == 0 else {"enabled": True, name: value}


def _service_account(value: str) -> str:
    namespace, sep, name = value.partition(":")
    if value and not (sep and namespace and name):
        raise click.BadParameter(f"{value!r} is not NAMESPACE:NAME", param_hint="--agent-service-account")
    return value


def _leader_election(
    kubernetes: KubeEnvironment | None,
    *,
    enabled: bool,
    namespace: str | None,
    lease_name: str,
    lease_duration: int,
    renew_deadline: float,
    retry_period: float,
    fence_idle_timeout: float,
    pod_name: str,
) -> LeaderElectionSettings | None:
    if not enabled:
        return None
    if kubernetes is None:
        raise ConfigError("--leader-election", "needs the Kubernetes API: run the controller in a pod")
    return LeaderElectionSettings(
        namespace=namespace or kubernetes.namespace,
        lease_name=lease_name,
        # As client-go: the pod name (= host name) for operators, plus a suffix unique to this process.
        identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        lease_duration_s=lease_duration,
        renew_deadline_s=renew_deadline,
        retry_period_s=retry_period,
        fence_idle_timeout_s=fence_idle_timeout,
        pod_name=pod_name,
    )


async def _serve(settings: ControllerSettings) -> None:
    # Imported here so that `topo-tune admin …` does not pay for SQLAlchemy, Alembic and APScheduler.
    from topo_tune.controller.heap import HeapKeeper  # noqa: PLC0415
    from topo_tune.controller.server import Controller  # noqa: PLC0415

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = Controller(settings, study_pass=InitPass())
    await server.start()
    emit_line(f"topo-tune controller listening on port {server.port}", err=True)
    heap = asyncio.create_task(HeapKeeper().run())  # the daemon's process alone: its sessions are its heap
    try:
        await stop.wait()
    finally:
        heap.cancel()
        await server.stop()
