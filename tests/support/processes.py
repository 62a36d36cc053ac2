"""Real controller and agent processes for end-to-end tests, started through the real CLI."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from tests.support.admin_shell import AdminShell
from tests.support.waiting import STARTUP_TIMEOUT_S, wait_until

TOKEN = "test-token-0123456789"


def process_gone(pid: int) -> bool:
    """No such process, or a zombie waiting for whoever inherited it to reap it: it runs no more."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


FREE_PORTS = range(10000, 20000)
"""Where tests draw the ports a process will listen on later: below the controller's ``port_range``
(20000-29999, the jobs' rendezvous ports) and the kernel's ephemeral range (32768 and up), where every outgoing
connection takes its local port; a port the system picked (binding to 0) could be taken that way before its
listener binds it (EADDRINUSE: seen once on the GPU with a kept communicator's store connection)."""

_draw = random.SystemRandom()


def free_port() -> int:
    """A loopback port in ``FREE_PORTS`` that nothing listens on now (drawn at random, so parallel tests rarely
    meet)."""
    for _ in range(1000):
        port = _draw.choice(FREE_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {FREE_PORTS.start}-{FREE_PORTS.stop - 1}")


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_TUNE_")}
    env["TOPO_TUNE_TOKEN"] = TOKEN
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "topo_tune", *args],
        env=env or cli_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Daemon:
    """One daemon process whose output goes to a log file."""

    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=cli_env)
    prefix: list[str] = field(default_factory=list)
    """Put before the command, e.g. ``ip netns exec NS`` to run it in a network namespace."""
    cwd: Path | None = None
    """Where it runs (what it writes to relative paths lands there); None: this process's directory."""
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        handle = self.log.open("ab")
        self.process = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "topo_tune", *self.args],
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
        )
        handle.close()
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crash or OOM kill would do."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def logged_at(self, message: str, **fields: str) -> datetime | None:
        """When the daemon (started with ``--log-format json``) last logged ``message`` with these fields:
        its own clock, not the time a test that polls it got to see the effect."""
        found = None
        for line in self.output().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line from outside logging (a crash's last words)
            if not isinstance(record, dict) or record.get("message") != message:
                continue
            if all(str(record.get(key)) == value for key, value in fields.items()):
                found = datetime.fromisoformat(str(record["time"]))
        return found


@dataclass
class LocalCluster:
    """A controller process and agent processes on loopback, all through the CLI."""

    workdir: Path
    database_url: str
    heartbeat_interval: float = 0.3
    heartbeat_expiry: float = 1.5
    port: int = field(default_factory=free_port)
    controller: Daemon | None = None
    agents: dict[str, Daemon] = field(default_factory=dict)
    _admin_shell: AdminShell | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_controller(self, *, timeout: float = STARTUP_TIMEOUT_S) -> Daemon:
        self.controller = Daemon(
            [
                "--log-format",
                "json",  # tests read the controller's own times of events from its log
                "controller",
                "serve",
                "--listen",
                self.address,
                "--database",
                self.database_url,
                "--heartbeat-interval",
                str(self.heartbeat_interval),
                "--heartbeat-expiry",
                str(self.heartbeat_expiry),
            ],
            self.workdir / "controller.log",
            cwd=self.workdir,  # where it writes its studies' outputs
        ).start()
        wait_until(
            lambda: self.admin("nodes", "-o", "json").returncode == 0, timeout=timeout, what="controller to serve"
        )
        return self.controller

    def start_agent(self, name: str, *, rack: str = "") -> Daemon:
        args = [
            "agent",
            "run",
            "--controller",
            self.address,
            "--node-name",
            name,
            "--backend",
            "sim",
            "--state-dir",
            str(self.workdir / f"state-{name}"),
            "--config-dir",
            str(self.workdir / f"config-{name}"),
            "--reconnect-max",  # the tests restart the controller: reconnects stay prompt however long that took
            "2",
        ]
        if rack:
            args += ["--rack", rack]
        agent = Daemon(args, self.workdir / f"agent-{name}.log").start()
        self.agents[name] = agent
        return agent

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``topo-tune admin ...`` against this cluster, run by one long-lived CLI process (tests poll it)."""
        if self._admin_shell is None:
            self._admin_shell = AdminShell([], cli_env(), self.workdir / "admin.log")
        command, *rest = args
        return self._admin_shell.run(["admin", command, "--controller", self.address, *rest], timeout=60)

    def stop(self) -> None:
        for daemon in [*self.agents.values(), self.controller]:
            if daemon is not None:
                daemon.kill()
        if self._admin_shell is not None:
            self._admin_shell.close()
