"""A real one-node Slurm 22.05 for tests: munged on its own socket, slurmctld, and one slurmd in a mount namespace.

Debian's ``slurm-wlm`` and ``munge`` (``make slurm`` installs them). slurmd 22.05 insists on a cgroup
hierarchy even with ``proctrack/linuxproc`` and ``task/none``: it gets an empty tmpfs on ``/sys/fs/cgroup``
in a mount namespace of its own, so the host's cgroups are never touched. Everything lives under one
directory (configuration, state, logs, sockets) and the daemons are found by ``SLURM_CONF``; the commands
(``sbatch``, ``scontrol``) are run with :meth:`SlurmOneNode.env`.

Non-goals: several hosts (the network-namespace harness does that), accounting, MPI plugins.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import free_port
from tests.support.waiting import wait_until

SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "unshare")


def slurm_missing() -> list[str]:
    """The programs a real Slurm needs that are not installed (``make slurm`` installs them)."""
    return [name for name in SLURM_PROGRAMS if shutil.which(name) is None]


@dataclass
class SlurmOneNode:
    """One slurmctld and one slurmd (``node``) under ``root``; extra slurm.conf lines in ``conf_lines``."""

    root: Path
    node: str = "tt-node1"
    conf_lines: list[str] = field(default_factory=list)
    other_nodes: tuple[str, ...] = ()
    """Nodes slurm.conf names that have no slurmd (they stay down): for topology files over several nodes."""
    topology_conf: str = ""
    """topology.conf next to slurm.conf (with ``TopologyPlugin=topology/tree`` in ``conf_lines``)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TOPO_TUNE_"))}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> None:
        for sub in ("etc", "state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o400)
        socket = munge / "munge.socket"
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
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        # An empty cgroup tree of slurmd's own: 22.05's cgroup/v1 plugin wants one, the host's is left alone.
        mount_and_run = 'mount -t tmpfs none /sys/fs/cgroup && exec "$@"'
        slurmd = ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)]
        unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_and_run, "sh"]
        self._spawn([*unshare, *slurmd], "slurmd")
        wait_until(self._node_idle, timeout=60, interval=0.3, what=f"slurmd {self.node} to be idle in slurmctld")

    def _node_idle(self) -> bool:
        shown = self.run("sinfo", "--noheader", "--node", self.node, "--format", "%T")
        return shown.stdout.strip() == "idle"

    def _write_conf(self, munge_socket: Path) -> None:
        root = self.root
        lines = [
            "ClusterName=topotune",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
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
            f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=1 State=UNKNOWN",
            *(f"NodeName={name} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN" for name in self.other_nodes),
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
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


@contextmanager
def slurm_one_node(root: Path, **options: object) -> Iterator[SlurmOneNode]:
    """A started :class:`SlurmOneNode`, stopped on leaving."""
    slurm = SlurmOneNode(root, **options)  # type: ignore[arg-type]
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()
