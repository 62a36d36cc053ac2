"""The agent's settings: built once by the CLI from flags and environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from topo_tune.agent.bench.kept_workers import DEFAULT_MAX_SETS
from topo_tune.kube.environment import KubeEnvironment
from topo_tune.kube.rack import DEFAULT_RACK_LABEL
from topo_tune.nccl.backends import Backend
from topo_tune.security.auth import TlsFiles
from topo_tune.versions.layout import DEFAULT_CONFIG_DIR


@dataclass(frozen=True)
class AgentSettings:
    controller: str
    """HOST:PORT of the controller."""
    node_name: str
    token: str
    token_file: Path | None = None
    """Where ``token`` came from: read again at every session (a Kubernetes projected token is rotated)."""
    rack: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    backend: Backend = Backend.GLOO
    state_dir: Path = Path("/var/lib/topo-tune")
    """The agent's journal of commands and results lives here; it survives agent restarts."""
    config_dir: Path = DEFAULT_CONFIG_DIR
    address: str = ""
    """Where peers reach this node for benchmarks (gloo binds here); empty: what the controller sees."""
    plugin_dirs: tuple[Path, ...] = (Path("/opt/topo-tune/lib"),)
    """The only directories whose NCCL plugins a benchmark job may load."""
    worker_env: Mapping[str, str] = field(default_factory=dict)
    """Variables this node's operator gives every benchmark worker (checked by the env policy); they win over
    a job's values, e.g. ``NCCL_NVLS_ENABLE=0`` where NVLink multicast must stay off."""
    ranks_per_gpu: int = 1
    """Benchmark ranks on each GPU; more than 1 is the ``--ranks-per-gpu`` test and development mode."""
    kept_worker_sets: int = DEFAULT_MAX_SETS
    """Idle benchmark worker sets kept for later jobs of the same environment (0: a fresh set every job)."""
    sim_profile: str = "h100-nvswitch"
    """For the ``sim`` backend: the simulated node this agent stands for."""
    sim_gpus: int = 8
    benchmark_deadline_s: float = 600.0
    """Deadline of a benchmark job whose command gives none."""
    tls: TlsFiles | None = None
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    """Reconnect delays grow from ``backoff_initial_s`` to this cap, with full jitter."""
    token_grace_s: float = 60.0
    """How long a token read from ``token_file`` is retried while the controller refuses it, waiting for the file
    to be rewritten (kubelet rotates a projected token in place); a changed token starts the wait again. Past it,
    or with no token file, the refusal ends the agent (``AgentRefused``)."""
    default_heartbeat_interval_s: float = 10.0
    """Used until the controller says otherwise in ``Registered``."""
    kubernetes: KubeEnvironment | None = None
    """The Kubernetes API when the agent runs in a pod: without ``rack``, the rack comes from a node label."""
    rack_label: str = DEFAULT_RACK_LABEL
    """Node label that names the rack (cluster.yaml's ``rackLabel``)."""
