"""The controller's settings: built once by the CLI from cluster.yaml, flags and environment.

What cluster.yaml holds is its own section objects (``DriftConfig``, ``RolloutGateConfig``, ...) or, for the
flat values, defaults read from ``ControllerConfig``: each default is written once, in ``config/cluster.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from topo_tune.config.cluster import (
    ControllerConfig,
    DriftConfig,
    JobCapsConfig,
    LearningConfig,
    RetentionConfig,
    RolloutConfig,
    RolloutGateConfig,
    RolloutThresholdsConfig,
)
from topo_tune.kube.environment import KubeEnvironment
from topo_tune.kube.leader_election import LeaderElectionSettings
from topo_tune.security.auth import TlsFiles

_FILE = ControllerConfig()
_ROLLOUT = RolloutConfig()


@dataclass(frozen=True)
class ControllerSettings:
    listen: str = _FILE.listen
    """HOST:PORT for both gRPC services; port 0 picks a free port (tests)."""
    database_url: str = _FILE.database
    token: str = ""
    """The shared bearer token every agent and admin must present."""
    tls: TlsFiles | None = None
    """Server certificate and key; with ``ca`` set, clients must present certificates (mTLS)."""
    metrics_listen: str | None = None
    """HOST:PORT for Prometheus' /metrics; None: off."""
    health_listen: str | None = None
    """A plaintext gRPC port serving only the health service (kubelet probes cannot do mTLS)."""
    heartbeat_interval_s: float = _FILE.heartbeat_interval
    heartbeat_expiry_s: float = _FILE.heartbeat_expiry
    """Silence after which a node is ``lost``: three missed heartbeats by default."""
    fanout_window: int = 512
    """Nodes a fan-out (``SendCommands``) delivers to at once."""
    rack_of: Mapping[str, str] = field(default_factory=dict)
    """Node → rack from cluster.yaml; it wins over what an agent says."""
    spine_oversubscription: float | None = None
    spine_bandwidth_gbps: float | None = None
    """The links between racks, from cluster.yaml's ``spine``; shown by ``admin topology``."""
    spine_ecmp_paths: int = 1
    """Spine paths flows are hashed over (cluster.yaml ``spine.paths`` with ``hashing: ecmp``); sim jobs model it."""
    benchmark_result_grace_s: float = 15.0
    """After a benchmark job's deadline, how long results already on their way may still arrive."""
    studies_dir: Path = Path("topo-tune-studies")
    """Where studies started with ``admin study start`` write their outputs (one directory per study)."""
    shutdown_grace_s: float = 5.0
    """How long in-flight RPCs may finish after SIGTERM."""
    max_message_bytes: int = 16 * 1024 * 1024
    controller_id: str = ""
    kubernetes: KubeEnvironment | None = None
    """The Kubernetes API (in-cluster): node idleness checks, and leader election when enabled."""
    agent_service_account: str = ""
    """``NAMESPACE:NAME`` of the agents' service account (in-cluster): an agent pod's projected token (audience
    ``topo-tune``) is then accepted as the agent credential of the node TokenReview names."""
    leader_election: LeaderElectionSettings | None = None
    """None: this controller is the only one and always leads. Set: only the Lease holder acts."""
    agent_config_dir: Path = Path(_ROLLOUT.agent_config_dir)
    """Where the agents stage config versions (the same path on every node): gate benchmarks point there."""
    rollout_gate: RolloutGateConfig = field(default_factory=RolloutGateConfig)
    rollout_thresholds: RolloutThresholdsConfig = field(default_factory=RolloutThresholdsConfig)
    """What a rollout's wave gates measure and judge by unless its request says otherwise (cluster.yaml's
    ``rollout`` section)."""
    rollout_interval_s: float = 1.0
    """How often the active rollout is reconciled with what the agents report."""
    job_pin_retention_days: float = 30.0
    """Job pins older than this are forgotten (a job asking again after that gets a fresh answer)."""
    job_caps: JobCapsConfig = field(default_factory=JobCapsConfig)
    """How many pins and comparisons one job credential holds, and how large one may be (``controller.jobCaps``)."""
    drift: DriftConfig = field(default_factory=DriftConfig)
    """The periodic drift check of the active config version (``controller.drift`` in cluster.yaml)."""
    learning: LearningConfig = field(default_factory=LearningConfig)
    """Production jobs teaching the tuner (cluster.yaml's ``learning``): off by default."""
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    """How long benchmark results, events and drift checks are kept (``controller.retention``)."""
