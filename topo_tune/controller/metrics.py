"""Prometheus metrics of one controller, in a registry of its own (tests run several controllers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class ControllerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.sessions = Gauge("topo_tune_agent_sessions", "Agents with an open session", registry=r)
        self.nodes = Gauge("topo_tune_nodes", "Registered nodes by state", ["state"], registry=r)
        self.nodes_config_damaged = Gauge(
            "topo_tune_nodes_config_damaged",
            "Nodes whose active config version's files no longer hash to its id",
            registry=r,
        )
        self.registrations = Counter("topo_tune_registrations", "Agent registrations", registry=r)
        self.heartbeats = Counter("topo_tune_heartbeats", "Heartbeats received", registry=r)
        self.commands_sent = Counter("topo_tune_commands_sent", "Command deliveries put on the wire", registry=r)
        self.rejected_messages = Counter(
            "topo_tune_rejected_messages", "Agent messages refused as malformed", registry=r
        )
        self.leader = Gauge("topo_tune_controller_leader", "1 while this controller leads and acts", registry=r)
        self.db_seconds = Histogram(
            "topo_tune_sweep_duration_seconds", "Time of one expiry sweep and heartbeat flush", registry=r
        )
        self.drift_checks = Counter(
            "topo_tune_drift_checks", "Drift checks of the active config version, by outcome", ["status"], registry=r
        )
        self.drift_regressions = Counter(
            "topo_tune_drift_regressions",
            "Drift checks whose bus bandwidth fell beyond the threshold against the version's reference",
            registry=r,
        )
        self.topology_changes = Counter(
            "topo_tune_topology_changes", "Nodes that registered again with another topology fingerprint", registry=r
        )
        self.periodic_runs_skipped = Counter(
            "topo_tune_periodic_runs_skipped",
            "Runs of a periodic job skipped because its previous run was still going, by job",
            ["job"],
            registry=r,
        )
        self.retention_deleted = Counter(
            "topo_tune_retention_deleted", "Rows deleted by retention, by kind", ["kind"], registry=r
        )
