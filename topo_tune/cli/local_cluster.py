"""An embedded controller and the agents of the nodes that are this machine, all in this process.

``topo-tune init`` needs a controller (unless ``cluster.yaml`` names a remote one) and agents for the nodes
the file lists. This module starts the controller and an agent for every node that is this machine
(``nodes_here``), over real gRPC, exactly as the daemons would run: the tuning pass talks to the controller
through the admin API either way. An ``nccl`` node here gets a real ``nccl`` agent (GPUs discovered, one
worker per GPU); ``sim`` and unaddressed ``gloo`` nodes all run here. The other nodes' agents are the
operator's to start: ``agent_command`` is the line to run there, with the token file ``token_file_for``
leaves; the pass waits for them.

Non-goal: production deployment (that is ``topo-tune controller serve`` / ``agent run`` or the Helm chart).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import secrets
import shlex
import socket
import stat
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from topo_tune.agent.daemon import Agent
from topo_tune.agent.settings import AgentSettings
from topo_tune.cli.study_pass import InitPass
from topo_tune.config.cluster import ClusterConfig, NodeConfig
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.server import Controller
from topo_tune.controller.settings import ControllerSettings
from topo_tune.errors import ConfigError
from topo_tune.nccl.backends import Backend
from topo_tune.security.safe_write import SECRET_FILE_MODE, write_file
from topo_tune.sim.node_topology import simulated_node_topology

logger = logging.getLogger(__name__)

_WILDCARD = frozenset({"0.0.0.0", "::", "[::]", ""})


@dataclass(frozen=True)
class ThisHost:
    """What names and addresses mean this machine: its host name (full and short) and what it resolves to."""

    names: frozenset[str]
    addresses: frozenset[str]

    @classmethod
    def detect(cls) -> ThisHost:
        hostname = socket.gethostname()
        addresses = {"127.0.0.1", "::1"}
        with contextlib.suppress(OSError):  # a host name that does not resolve still names this machine
            addresses |= {str(info[4][0]) for info in socket.getaddrinfo(hostname, None)}
        return cls(frozenset({hostname.lower(), hostname.split(".")[0].lower(), "localhost"}), frozenset(addresses))

    def owns(self, address: str) -> bool:
        """Whether ``address`` (a host name or IP, with or without a port) is this machine."""
        host = address.strip()
        if host.startswith("["):
            host = host[1:].partition("]")[0]
        elif host.count(":") == 1:
            host = host.partition(":")[0]
        try:
            if ipaddress.ip_address(host).is_loopback:
                return True
        except ValueError:
            return host.lower() in self.names
        return host in self.addresses


def node_is_here(node: NodeConfig, cluster: ClusterConfig, host: ThisHost) -> bool:
    """Whether ``node`` of ``cluster`` is this machine, so ``init`` runs its agent itself.

    ``sim`` nodes always are (they are simulated here). A node with an address is here when the address is
    this machine's. Without one, a ``gloo`` node is a stand-in run here (several on one CPU box), and an
    ``nccl`` node is here when it is named by this host or is the cluster's only node (one GPU box).
    """
    if cluster.backend.simulated:
        return True
    if node.address:
        return host.owns(node.address)
    if cluster.backend.runs_on_cpus:
        return True
    return node.name.lower() in host.names or sum(len(rack.nodes) for rack in cluster.racks) == 1


def nodes_here(cluster: ClusterConfig, host: ThisHost) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The nodes whose agents ``init`` runs here, and the others, in cluster.yaml's order.

    Two ``nccl`` nodes on this machine are refused: each agent would take every GPU.
    """
    here: list[str] = []
    elsewhere: list[str] = []
    for rack in cluster.racks:
        for node in rack.nodes:
            (here if node_is_here(node, cluster, host) else elsewhere).append(node.name)
    if cluster.backend.runs_nccl and len(here) > 1:
        raise ConfigError(
            "racks",
            f"nodes {here[0]} and {here[1]} are both this machine; an nccl node is a whole machine "
            "(give each node its own address or host name)",
        )
    return tuple(here), tuple(elsewhere)


def token_file_for(path: Path) -> str:
    """The token in ``path``, made (mode 0600, a fresh random token) unless a private one is there already.

    Reusing it lets agents started on other nodes for an earlier run reconnect when ``init`` resumes.
    """
    try:
        info = path.lstat()
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077:
            token = path.read_text(encoding="utf-8").strip()
            if len(token) >= 32:
                return token
    except (OSError, UnicodeDecodeError):
        pass
    token = secrets.token_hex(16)
    _write_private(path, token)
    return token


def node_credential_file(directory: Path, node_name: str, admin_token: str) -> Path:
    """``directory/agent-NODE.token`` (mode 0600): the node's own agent credential, to copy to that node only.

    A node elsewhere gets this rather than the controller's admin token: it may register as itself, nothing else.
    """
    path = directory / f"agent-{node_name}.token"
    _write_private(path, Credentials(admin_token).issue_agent(node_name))
    return path


def _write_private(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, f"{token}\n", mode=SECRET_FILE_MODE)  # 0600 even where an older copy was wider


def agent_command(
    node: NodeConfig,
    *,
    rack: str,
    backend: Backend,
    controller: str,
    token_file: Path,
) -> str:
    """The ``topo-tune agent run`` line that makes ``node`` join the controller at ``controller``."""
    words = ["topo-tune", "agent", "run", "--controller", controller, "--token-file", str(token_file)]
    words += ["--node-name", node.name, "--rack", rack, "--backend", backend.value]
    if node.address:
        words += ["--address", node.address]
    for key, value in sorted(node.worker_env.items()):
        words += ["--worker-env", f"{key}={value}"]
    return shlex.join(words)


def _host_of(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


@dataclass
class EmbeddedCluster:
    """A controller listening on ``listen`` (a free loopback port by default) and the agents ``start`` asks for."""

    cluster: ClusterConfig
    workdir: Path
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    listen: str = "127.0.0.1:0"
    controller: Controller | None = None
    agents: dict[str, tuple[Agent, asyncio.Event, asyncio.Task[None]]] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """Where this machine reaches the controller (the admin client and the local agents)."""
        assert self.controller is not None, "start() first"
        host, _ = _host_of(self.listen)
        return f"{'127.0.0.1' if host in _WILDCARD else host}:{self.controller.port}"

    @property
    def public_address(self) -> str:
        """Where other machines reach the controller: this host's name when it listens on every interface."""
        assert self.controller is not None, "start() first"
        host, _ = _host_of(self.listen)
        return f"{socket.gethostname() if host in _WILDCARD else host}:{self.controller.port}"

    @property
    def database_url(self) -> str:
        section = self.cluster.controller
        default = type(section).model_fields["database"].default
        return section.database if section.database != default else f"sqlite:///{self.workdir / 'topo-tune.db'}"

    async def start(self, *, local: Collection[str] | None = None) -> None:
        """Start the controller, then an agent for each node named in ``local`` (None: every node)."""
        if local is None:
            local = tuple(self.cluster.rack_of())
        self.workdir.mkdir(parents=True, exist_ok=True)
        spine = self.cluster.spine
        self.controller = Controller(
            ControllerSettings(
                listen=self.listen,
                database_url=self.database_url,
                token=self.token,
                heartbeat_interval_s=1.0,
                heartbeat_expiry_s=10.0,
                rack_of=self.cluster.rack_of(),
                spine_oversubscription=spine.oversubscription if spine else None,
                spine_bandwidth_gbps=spine.bandwidth_gbps if spine else None,
                spine_ecmp_paths=spine.ecmp_paths if spine else 1,
                benchmark_result_grace_s=5.0,
                shutdown_grace_s=1.0,
            ),
            study_pass=InitPass(),
        )
        await self.controller.start()
        # With nodes elsewhere, a node here must give its peers an address they can reach.
        everywhere = len(local) == len(self.cluster.rack_of())
        for rack in self.cluster.racks:
            for node in rack.nodes:
                if node.name in local:
                    address = node.address or ("127.0.0.1" if everywhere else socket.gethostname())
                    self._start_agent(node, rack.name, address)

    def _start_agent(self, node: NodeConfig, rack: str, address: str) -> None:
        backend, name, gpus = self.cluster.backend, node.name, node.gpus
        settings = AgentSettings(
            controller=self.address,
            node_name=name,
            token=Credentials(self.token).issue_agent(name),  # each agent as its own node only, like a daemon
            rack=rack,
            backend=backend,
            address=address,
            state_dir=self.workdir / "agents" / name,
            config_dir=self.workdir / "agents" / name / "config",
            backoff_initial_s=0.2,
            backoff_max_s=2.0,
            sim_gpus=max(1, gpus),
            worker_env=node.worker_env,
        )
        if backend.simulated:
            agent = Agent(settings, discover=lambda: simulated_node_topology(name, gpus=max(1, gpus)))
        else:
            agent = Agent(settings)
        stop = asyncio.Event()
        self.agents[name] = (agent, stop, asyncio.create_task(agent.run(stop), name=f"agent-{name}"))

    async def stop(self) -> None:
        for _, stop, _ in self.agents.values():
            stop.set()
        for _, _, task in self.agents.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        self.agents.clear()
        if self.controller is not None:
            await self.controller.stop()
            self.controller = None
