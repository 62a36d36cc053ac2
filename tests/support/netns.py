"""Cluster in a box: hosts as Linux network namespaces, links as veth pairs shaped with ``tc``.

Loopback makes every link equal; namespaces do not. ``NetnsCluster`` builds, from a ``ClusterShape``:

- one namespace per host, its address a /32 on the namespace's ``lo`` (from 198.18.0.0/15, the block
  reserved for benchmarking, RFC 2544), and one veth link per pair of hosts with a host route per peer
  over that pair's veth, so each pair of hosts has a link of its own and the bandwidth matrix is free;
- a *shared spine* when ``spine_mbit`` is set: then hosts of different racks have no direct link; each
  rack gets a switch namespace (a router), each host an uplink to its rack's switch, and each pair of
  racks one switch-to-switch link, so all traffic between two racks shares that one link;
- a controller namespace with an unshaped link to every host (the control plane is not what we measure);
- a token-bucket filter (``tbf``) on *both* ends of every shaped veth (``tbf`` shapes egress only);
- the controller and one agent process per host, each started with ``ip netns exec``.

Nothing is routed outside: the namespaces have no default route and no link to the machine's own
namespace, so a packet to any address the harness did not assign fails with "network unreachable" instead
of leaving the box. Every run uses a fresh name prefix; ``close`` kills every process still living in the
run's namespaces (by pid) and deletes the namespaces, which takes their veth ends with them.

Non-goals: latency or loss (``netem`` is not available on the CI machines), more than 250 hosts.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.admin_shell import AdminShell
from tests.support.processes import Daemon, cli_env
from tests.support.waiting import STARTUP_TIMEOUT_S, wait_until

BLOCK = ipaddress.ip_network("198.18.0.0/15")
"""Every address the harness assigns lies in this block (reserved for network benchmarking)."""
CONTROLLER_ADDRESS = "198.18.0.1"
CONTROLLER_PORT = 50051
PREFIX_PATTERN = re.compile(r"^tt[0-9a-f]{6}-")
"""Namespace names of every run start with ``tt`` and six hex digits (the leftover check looks for them)."""
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


_MOUNT_THEN = ["sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "mount-then"]
"""``sh -c`` that bind-mounts its first argument on its second, then runs the rest in its place."""


class NamespacesUnavailable(RuntimeError):
    """This process may not create network namespaces (it needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN)."""


@dataclass(frozen=True)
class ClusterShape:
    """Hosts in racks and the rate of every link, in Mbit/s (10^6 bit/s, as ``tc`` counts)."""

    racks: Mapping[str, Sequence[str]]
    """Rack name → its hosts, in order."""
    rack_mbit: float = 1000.0
    """Links between hosts of one rack (and a host's uplink to its rack switch)."""
    cross_rack_mbit: float = 1000.0
    """Direct links between hosts of different racks, when there is no shared spine."""
    spine_mbit: float | None = None
    """When set, racks talk through one shared link per pair of racks at this rate instead."""
    pair_mbit: Mapping[frozenset[str], float] = field(default_factory=dict)
    """Direct links with their own rate (``frozenset({a, b})``); not for pairs that go over a spine."""

    def __post_init__(self) -> None:
        hosts = self.hosts
        if not hosts:
            raise ValueError("racks: a cluster needs at least one host")
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"racks: a host is listed twice: {hosts}")
        if len(hosts) > 250:
            raise ValueError(f"racks: at most 250 hosts, got {len(hosts)}")
        for name in [*self.racks, *hosts]:
            if not _NAME.match(name):
                raise ValueError(f"racks: {name!r} is not a short lower-case name ([a-z][a-z0-9-]*)")
        rates = [self.rack_mbit, self.cross_rack_mbit, *self.pair_mbit.values()]
        if self.spine_mbit is not None:
            rates.append(self.spine_mbit)
        if any(rate <= 0 for rate in rates):
            raise ValueError(f"rates must be positive, got {rates}")
        for pair in self.pair_mbit:
            unknown = set(pair) - set(hosts)
            if len(pair) != 2 or unknown:
                raise ValueError(f"pair_mbit: {sorted(pair)} is not a pair of known hosts")
            if self.via_spine(*sorted(pair)):
                raise ValueError(f"pair_mbit: {sorted(pair)} talk over the shared spine, not a direct link")

    @property
    def hosts(self) -> list[str]:
        return [host for members in self.racks.values() for host in members]

    def rack_of(self, host: str) -> str:
        return next(rack for rack, members in self.racks.items() if host in members)

    def via_spine(self, a: str, b: str) -> bool:
        return self.spine_mbit is not None and self.rack_of(a) != self.rack_of(b)

    def direct_mbit(self, a: str, b: str) -> float:
        """The rate of the direct link between ``a`` and ``b`` (they must have one)."""
        assert not self.via_spine(a, b), f"{a} and {b} talk over the spine"
        same_rack = self.rack_of(a) == self.rack_of(b)
        return self.pair_mbit.get(frozenset((a, b)), self.rack_mbit if same_rack else self.cross_rack_mbit)

    def path_mbit(self, a: str, b: str) -> float:
        """What one flow from ``a`` to ``b`` gets when nothing else runs: its path's slowest link."""
        if self.via_spine(a, b):
            assert self.spine_mbit is not None
            return min(self.rack_mbit, self.spine_mbit)
        return self.direct_mbit(a, b)


@dataclass(frozen=True)
class _Link:
    """One veth pair: (namespace, interface) at each end, its rate (None: unshaped) and the routes over it
    (namespace, ``ip route`` arguments), which the kernel drops when the link goes down."""

    a: tuple[str, str]
    b: tuple[str, str]
    mbit: float | None
    routes: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def ends(self) -> tuple[tuple[str, str], tuple[str, str]]:
        return self.a, self.b


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def check_namespaces_allowed() -> None:
    """Raise ``NamespacesUnavailable`` with the reason when this process cannot build a cluster."""
    if os.geteuid() != 0:
        raise NamespacesUnavailable(
            "the netns tests create network namespaces and need root (CI runs them as root); "
            f"this process runs as uid {os.geteuid()}"
        )
    for tool in ("ip", "tc"):
        if _run(["which", tool], check=False).returncode != 0:
            raise NamespacesUnavailable(f"the netns tests need iproute2's `{tool}` on PATH")


def namespaces_of_runs() -> list[str]:
    """Every namespace on this machine whose name says a harness run made it."""
    listed = _run(["ip", "-json", "netns", "list"]).stdout.strip()
    names = [entry["name"] for entry in json.loads(listed)] if listed else []
    return [name for name in names if PREFIX_PATTERN.match(name)]


def pids_in(namespace: str) -> list[int]:
    done = _run(["ip", "netns", "pids", namespace], check=False)
    return [int(pid) for pid in done.stdout.split()] if done.returncode == 0 else []


def _kill_all(pids: Iterable[int]) -> list[int]:
    """SIGKILL each pid; return those that were still there."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def tbf(namespace: str, interface: str, mbit: float, *, change: bool = False) -> None:
    """Shape ``interface``'s egress to ``mbit``: a bucket of 2 ms at that rate (at least 64 KiB, so a
    GSO super-packet fits) and at most 50 ms of queue."""
    burst = max(64 * 1024, int(mbit * 1e6 / 8 * 0.002))
    _run(
        [
            "tc",
            "-n",
            namespace,
            "qdisc",
            "change" if change else "add",
            "dev",
            interface,
            "root",
            "tbf",
            "rate",
            f"{mbit}mbit",
            "burst",
            str(burst),
            "latency",
            "50ms",
        ]
    )


@dataclass
class NetnsCluster:
    """The namespaces, links and processes of one run. Use as a context manager; ``close`` always cleans."""

    shape: ClusterShape
    workdir: Path
    heartbeat_interval: float = 0.3
    heartbeat_expiry: float = 1.5
    start_timeout: float = STARTUP_TIMEOUT_S
    """How long the controller may take to serve (the agents to register: twice that) on a busy machine."""
    prefix: str = field(default_factory=lambda: f"tt{uuid.uuid4().hex[:6]}-")
    controller: Daemon | None = None
    agents: dict[str, Daemon] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)
    _links: dict[frozenset[str], _Link] = field(default_factory=dict)
    _admin_shell: AdminShell | None = None

    # -- naming and addresses -------------------------------------------------------------------------

    def namespace(self, host: str) -> str:
        return f"{self.prefix}{host}"

    @property
    def controller_namespace(self) -> str:
        return f"{self.prefix}controller"

    def address(self, host: str) -> str:
        return str(BLOCK[256 + 1 + self.shape.hosts.index(host)])  # 198.18.1.x

    def _switch(self, rack: str) -> str:
        return f"{self.prefix}switch-{rack}"

    def _switch_address(self, rack: str) -> str:
        return str(BLOCK[512 + 1 + list(self.shape.racks).index(rack)])  # 198.18.2.x

    @property
    def controller_address(self) -> str:
        return f"{CONTROLLER_ADDRESS}:{CONTROLLER_PORT}"

    # -- building -------------------------------------------------------------------------------------

    def __enter__(self) -> NetnsCluster:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def build(self) -> None:
        check_namespaces_allowed()
        self.workdir.mkdir(parents=True, exist_ok=True)
        hosts = self.shape.hosts
        self._add_namespace(self.controller_namespace, CONTROLLER_ADDRESS)
        for host in hosts:
            self._add_namespace(self.namespace(host), self.address(host))
        for index, host in enumerate(hosts):
            # Control plane: controller <-> host, unshaped.
            self._connect(
                (self.controller_namespace, f"h{index}"), self.address(host),
                (self.namespace(host), "ctl"), CONTROLLER_ADDRESS,
                key=frozenset(("controller", host)), mbit=None,
            )  # fmt: skip
        for a, b in itertools.combinations(hosts, 2):
            if not self.shape.via_spine(a, b):
                ia, ib = hosts.index(a), hosts.index(b)
                self._connect(
                    (self.namespace(a), f"p{ib}"), self.address(b),
                    (self.namespace(b), f"p{ia}"), self.address(a),
                    key=frozenset((a, b)), mbit=self.shape.direct_mbit(a, b),
                )  # fmt: skip
        if self.shape.spine_mbit is not None:
            self._build_spine(self.shape.spine_mbit)

    def _add_namespace(self, namespace: str, address: str, *, forwarding: bool = False) -> None:
        _run(["ip", "netns", "add", namespace])
        self._namespaces.append(namespace)
        _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        _run(["ip", "-n", namespace, "addr", "add", f"{address}/32", "dev", "lo"])
        if forwarding:
            _run(["ip", "netns", "exec", namespace, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])

    def _connect(
        self,
        a: tuple[str, str],
        a_reaches: str,
        b: tuple[str, str],
        b_reaches: str,
        *,
        key: frozenset[str],
        mbit: float | None,
        a_routes: Iterable[str] = (),
        b_routes: Iterable[str] = (),
    ) -> None:
        """A veth pair from ``a`` to ``b``; each end gets a host route to the address on the other side
        (``x_reaches``), plus routes to ``x_routes`` with that address as the next hop."""
        (ns_a, if_a), (ns_b, if_b) = a, b
        _run(["ip", "link", "add", if_a, "netns", ns_a, "type", "veth", "peer", "name", if_b, "netns", ns_b])
        routes: list[tuple[str, tuple[str, ...]]] = []
        for namespace, interface, peer, routed in (
            (ns_a, if_a, a_reaches, a_routes),
            (ns_b, if_b, b_reaches, b_routes),
        ):
            _run(["ip", "-n", namespace, "link", "set", interface, "up"])
            routes.append((namespace, (f"{peer}/32", "dev", interface)))
            routes += [(namespace, (f"{to}/32", "via", peer, "dev", interface, "onlink")) for to in routed]
            if mbit is not None:
                tbf(namespace, interface, mbit)
        link = _Link(a, b, mbit, tuple(routes))
        self._links[key] = link
        self._add_routes(link)

    @staticmethod
    def _add_routes(link: _Link) -> None:
        for namespace, route in link.routes:
            _run(["ip", "-n", namespace, "route", "replace", *route])

    def _build_spine(self, spine_mbit: float) -> None:
        """Rack switches, host uplinks and one shared link per pair of racks."""
        hosts = self.shape.hosts
        racks = list(self.shape.racks)
        for rack in racks:
            self._add_namespace(self._switch(rack), self._switch_address(rack), forwarding=True)
        for host in hosts:
            rack = self.shape.rack_of(host)
            remote = [self.address(h) for h in hosts if self.shape.via_spine(host, h)]
            self._connect(
                (self.namespace(host), "uplink"), self._switch_address(rack),
                (self._switch(rack), f"h{hosts.index(host)}"), self.address(host),
                key=frozenset((host, f"switch-{rack}")), mbit=self.shape.rack_mbit,
                a_routes=remote,
            )  # fmt: skip
        for ra, rb in itertools.combinations(racks, 2):
            self._connect(
                (self._switch(ra), f"r{racks.index(rb)}"), self._switch_address(rb),
                (self._switch(rb), f"r{racks.index(ra)}"), self._switch_address(ra),
                key=frozenset((f"switch-{ra}", f"switch-{rb}")), mbit=spine_mbit,
                a_routes=[self.address(h) for h in self.shape.racks[rb]],
                b_routes=[self.address(h) for h in self.shape.racks[ra]],
            )  # fmt: skip

    # -- faults ---------------------------------------------------------------------------------------

    def _link(self, a: str, b: str) -> _Link:
        try:
            return self._links[frozenset((a, b))]
        except KeyError:
            raise KeyError(f"no direct link between {a} and {b}") from None

    def set_link(self, a: str, b: str, *, up: bool) -> None:
        """Cut (``up=False``) or restore the link between ``a`` and ``b`` (``"controller"`` names the
        controller, ``"switch-RACK"`` a rack switch). Both ends go down, as when a cable is pulled."""
        link = self._link(a, b)
        for namespace, interface in (link.a, link.b):
            _run(["ip", "-n", namespace, "link", "set", interface, "up" if up else "down"])
        if up:
            self._add_routes(link)  # the kernel dropped them with the link

    def sent_bytes(self, a: str, b: str) -> int:
        """Bytes ``a`` has sent on its end of the link to ``b`` (traffic shows a job's ranks are running)."""
        namespace, interface = next(end for end in self._link(a, b).ends if end[0] == self.namespace(a))
        shown = json.loads(_run(["ip", "-n", namespace, "-j", "-s", "link", "show", "dev", interface]).stdout)
        return int(shown[0]["stats64"]["tx"]["bytes"])

    def set_rate(self, a: str, b: str, mbit: float) -> None:
        """Change the rate of a shaped link, both directions, while traffic may be flowing."""
        link = self._link(a, b)
        assert link.mbit is not None, f"the link {a}-{b} is not shaped"
        for namespace, interface in (link.a, link.b):
            tbf(namespace, interface, mbit, change=True)

    # -- processes ------------------------------------------------------------------------------------

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        namespace = self.controller_namespace if host == "controller" else self.namespace(host)
        return ["ip", "netns", "exec", namespace, *argv]

    def on_node(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as a process of a job on ``host`` runs it: in the host's namespace, with the host agent's own
        config directory at the one shared path (``config_dir``)."""
        own = self.workdir / f"config-{host}"
        return self.exec_argv(host, [*_MOUNT_THEN, str(own), str(self.config_dir), *argv])

    @property
    def config_dir(self) -> Path:
        """The agents' config directory: one path, as on real nodes, each agent's own directory mounted there
        in its private mount namespace (``ip netns exec`` gives every command one)."""
        return self.workdir / "config"

    def start_controller(self, database_url: str) -> Daemon:
        self.config_dir.mkdir(exist_ok=True)
        config = self.workdir / "cluster.yaml"
        config.write_text(
            json.dumps({"apiVersion": "topo-tune/v1", "rollout": {"agentConfigDir": str(self.config_dir)}})
        )
        self.controller = Daemon(
            [
                "--log-format", "json",  # tests read the controller's own times of events from its log
                "controller", "serve",
                "--config", str(config),
                "--listen", self.controller_address,
                "--database", database_url,
                "--heartbeat-interval", str(self.heartbeat_interval),
                "--heartbeat-expiry", str(self.heartbeat_expiry),
            ],
            self.workdir / "controller.log",
            prefix=self.exec_argv("controller", []),
            cwd=self.workdir,  # studies write their outputs under the working directory
        ).start()  # fmt: skip
        wait_until(
            lambda: self.admin("nodes").returncode == 0, what="the controller to serve", timeout=self.start_timeout
        )
        return self.controller

    def start_agent(self, host: str) -> Daemon:
        own = self.workdir / f"config-{host}"
        own.mkdir(exist_ok=True)
        self.config_dir.mkdir(exist_ok=True)
        agent = Daemon(
            [
                "agent", "run",
                "--controller", self.controller_address,
                "--node-name", host,
                "--rack", self.shape.rack_of(host),
                "--backend", "gloo",
                "--address", self.address(host),  # gloo binds here and peers dial it
                "--state-dir", str(self.workdir / f"state-{host}"),
                "--config-dir", str(self.config_dir),
                "--reconnect-max", "2",  # controller restarts: reconnects stay prompt however long one took
            ],
            self.workdir / f"agent-{host}.log",
            prefix=self.on_node(host, []),
        ).start()  # fmt: skip
        self.agents[host] = agent
        return agent

    def start_agents(self) -> None:
        for host in self.shape.hosts:
            self.start_agent(host)
        wait_until(
            lambda: self.node_states() == dict.fromkeys(self.shape.hosts, "ready"),
            what="every agent to register",
            timeout=2 * self.start_timeout,
            interval=0.2,
        )

    def admin(self, command: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``topo-tune admin COMMAND`` from inside the controller's namespace, JSON output.

        Run by one long-lived CLI process in that namespace (``tests/support/admin_shell.py``): scenarios
        poll through here many times a second, and a process per call would take the daemons' CPU."""
        if self._admin_shell is None:
            self._admin_shell = AdminShell(self.exec_argv("controller", []), cli_env(), self.workdir / "admin.log")
        argv = ["admin", command, *args, "--controller", self.controller_address, "--output", "json"]
        return self._admin_shell.run(argv, timeout=timeout)

    def admin_json(self, command: str, *args: str, timeout: float = 60) -> object:
        done = self.admin(command, *args, timeout=timeout)
        assert done.returncode == 0, f"admin {command} {args} exited {done.returncode}: {done.stderr.strip()}"
        return json.loads(done.stdout)

    def nodes(self) -> dict[str, dict[str, object]]:
        listed = self.admin_json("nodes")
        assert isinstance(listed, list)
        return {str(node["name"]): node for node in listed}

    def node_states(self) -> dict[str, str]:
        return {name: str(node["state"]) for name, node in self.nodes().items()}

    def run_in(
        self, host: str, argv: Sequence[str], *, timeout: float = 60, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``host``'s namespace (``"controller"``: the controller's) and wait for it."""
        return subprocess.run(
            self.exec_argv(host, argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=cli_env(),
            cwd=cwd,
        )

    def popen_in(self, host: str, argv: Sequence[str], *, cwd: Path | None = None) -> subprocess.Popen[str]:
        """Start ``argv`` in ``host``'s namespace; ``close`` kills it if the caller does not."""
        return subprocess.Popen(
            self.exec_argv(host, argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            cwd=cwd,
        )

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}"
            for path in sorted(self.workdir.glob("*.log"))
        )

    # -- teardown -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process in this run's namespaces, then delete the namespaces (and so every veth).

        Safe to call twice and after a partial build; errors are collected and raised at the end so
        one failure does not leave the rest behind.
        """
        for daemon in [*self.agents.values(), self.controller]:
            if daemon is not None:
                daemon.kill()
        if self._admin_shell is not None:
            self._admin_shell.close()
        problems: list[str] = []
        for namespace in reversed(self._namespaces):
            # Benchmark workers and anything else a test started in the namespace, by pid.
            try:
                wait_until(
                    lambda ns=namespace: not _kill_all(pids_in(ns)), timeout=10, what=f"processes in {namespace}"
                )
            except AssertionError as error:
                problems.append(str(error))
            done = _run(["ip", "netns", "del", namespace], check=False)
            if done.returncode != 0:
                problems.append(f"ip netns del {namespace}: {done.stderr.strip()}")
        self._namespaces.clear()
        if problems:
            raise RuntimeError("; ".join(problems))
