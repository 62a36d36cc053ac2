"""A real Slurm 22.05 for tests: munged on its own socket, one slurmctld, and a slurmd per node.

Debian's ``slurm-wlm`` and ``munge`` (``make slurm`` installs them). Everything lives under one directory
(configuration, state, logs, sockets; per-node paths carry the node's name through slurm.conf's ``%n``) and
the daemons are found by ``SLURM_CONF``; the commands (``sbatch``, ``scontrol``) are run with
:meth:`Slurm.env`. Where each daemon runs is the caller's: :attr:`Slurm.run_on` gives the argv prefix that
puts a process on a node (``None``: slurmctld's host). slurmd 22.05 insists on a cgroup hierarchy even with
``proctrack/linuxproc`` and ``task/none``: whatever runs it must give it an empty tmpfs on ``/sys/fs/cgroup``
in a mount namespace of its own (``CgroupPlugin=cgroup/v1``), so the machine's cgroups are never touched.

Non-goals: accounting, MPI plugins, more than one cluster per directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.waiting import wait_until

SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "unshare")

RunOn = Callable[[str | None], Sequence[str]]
"""The argv prefix that runs a process on a node (``None``: on slurmctld's host)."""


def slurm_missing() -> list[str]:
    """The programs a real Slurm needs that are not installed (``make slurm`` installs them)."""
    return [name for name in SLURM_PROGRAMS if shutil.which(name) is None]


def _here(_node: str | None) -> Sequence[str]:
    return ()


@dataclass
class Slurm:
    """slurmctld at ``controller`` (host name, address) and a slurmd for each of ``nodes`` (name → address)."""

    root: Path
    nodes: Mapping[str, str]
    controller: tuple[str, str]
    ctld_port: int
    slurmd_port: int
    run_on: RunOn = _here
    conf_lines: list[str] = field(default_factory=list)
    node_lines: list[str] = field(default_factory=list)
    """Extra ``NodeName=`` lines (nodes without a slurmd, for topology files over several nodes)."""
    cpus: int = 1
    node_hostname: str = ""
    """Every node's ``NodeHostname`` (empty: the node's name, as on hosts whose host name is their node name)."""
    topology_conf: str = ""
    """topology.conf next to slurm.conf (with ``TopologyPlugin=topology/tree`` in ``conf_lines``)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _slurmctld: subprocess.Popen[bytes] = field(init=False)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TOPO_TUNE_"))}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        argv = [*self.run_on(None), *args]
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> None:
        for sub in ("etc", "state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o400)
        socket = munge / "munge.socket"
        # One munged for every node: its socket is a path, reachable from any network namespace.
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
            ],
            "munged",
        )
        wait_until(socket.exists, timeout=20, what="munged's socket")
        self._write_conf(socket)
        self._start_slurmctld()
        for node in self.nodes:
            self._spawn([*self.run_on(node), "slurmd", "-D", "-N", node, "-f", str(self.conf)], f"slurmd-{node}")
        wait_until(self._nodes_idle, timeout=90, interval=0.3, what=f"slurmd on {', '.join(self.nodes)} to be idle")

    def _start_slurmctld(self) -> None:
        self._spawn([*self.run_on(None), "slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._slurmctld = self.processes[-1]

    def restart_slurmctld_afresh(self) -> None:
        """Stop slurmctld, forget its state (as a reinstalled controller does) and start it again: job ids
        start over at 1. Returns once every node is idle again."""
        self._slurmctld.send_signal(signal.SIGTERM)
        self._slurmctld.wait(timeout=30)
        shutil.rmtree(self.root / "state")
        (self.root / "state").mkdir()
        self._start_slurmctld()
        wait_until(self._nodes_idle, timeout=90, interval=0.3, what="every node idle under the new slurmctld")

    def _nodes_idle(self) -> bool:
        shown = self.run("sinfo", "--noheader", "--Node", "--format", "%N %T")
        states = dict(line.split() for line in shown.stdout.splitlines() if line.strip())
        return all(states.get(node) == "idle" for node in self.nodes)

    def _write_conf(self, munge_socket: Path) -> None:
        root = self.root
        host, address = self.controller
        lines = [
            "ClusterName=topotune",
            f"SlurmctldHost={host}({address})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool' / '%n'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'spool' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/linear",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            *self.conf_lines,
            *(
                f"NodeName={node} NodeAddr={address} NodeHostname={self.node_hostname or node} CPUs={self.cpus}"
                " State=UNKNOWN"
                for node, address in self.nodes.items()
            ),
            *self.node_lines,
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        (root / "etc" / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        if self.topology_conf:
            (root / "etc" / "topology.conf").write_text(self.topology_conf)

    def _spawn(self, args: list[str], name: str) -> None:
        log = (self.root / "log" / f"{name}.out").open("ab")
        self.processes.append(subprocess.Popen(args, env=self.env(), stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def logs(self) -> str:
        """Every daemon's log, for an assertion's message."""
        logs = sorted((self.root / "log").iterdir())
        return "\n".join(f"== {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs)
