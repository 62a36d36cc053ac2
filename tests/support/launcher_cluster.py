"""Cluster in a box for the real launchers: namespace hosts with their own host name, ``/etc/hosts`` and mounts,
real Slurm (one slurmctld, a slurmd per host), Open MPI across hosts, and torchrun.

Builds on :class:`~tests.support.netns.NetnsCluster` (a network namespace per host, an address per host, shaped
veth links). Each host, and the controller's namespace as the login host ``head``, also gets a UTS and a mount
namespace of its own, held by an *anchor* process (``sleep``) that everything of that host enters with
``nsenter --target PID``:

- its host name is its node name, and one ``/etc/hosts`` names every host's address (what srun, slurmstepd,
  Open MPI and gloo resolve their own and their peers' addresses with);
- the agents' one config-dir path (:attr:`NetnsCluster.config_dir`) is that host's own directory, mounted
  there, as on a real fleet where each node has its own disk (``head`` gets an empty one: it runs no agent);
- an empty tmpfs on ``/sys/fs/cgroup``: slurmd 22.05 wants a cgroup tree even with ``proctrack/linuxproc``;
- Open MPI starts its daemons on other hosts through ``plm_rsh_agent`` = :attr:`LauncherCluster.rsh_agent`, a
  script that enters the target host's namespaces as ssh would log in: a clean environment, nothing forwarded.

Non-goals: users, ssh itself, and shared file systems beyond the machine's own (every host sees the same files
except where a mount above says otherwise).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.netns import CONTROLLER_ADDRESS, NetnsCluster
from tests.support.slurm import Slurm, slurm_missing
from tests.support.waiting import wait_until

HEAD = "head"
"""The login host: the controller's namespace, where slurmctld and the topo-tune controller run; no agent."""
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
"""Slurm's own default ports: every host is a fresh network namespace, so nothing else holds them."""


def launchers_missing() -> list[str]:
    """The programs this cluster needs that are not installed (``make slurm openmpi`` installs them)."""
    return [*slurm_missing(), *(name for name in ("mpirun", "nsenter") if shutil.which(name) is None)]


_ANCHOR = """\
set -e
hostname "$1"
mount --bind "$2" /etc/hosts
mount -t tmpfs none /sys/fs/cgroup
mount --bind "$3" "$4"
touch "$5"
exec sleep infinity
"""
"""Run in a host's fresh UTS and mount namespaces: name it, mount its files, say so, then hold the namespaces."""

_RSH_AGENT = """\
#!/bin/sh
# Open MPI's plm_rsh_agent, called as "AGENT HOST COMMAND...": runs COMMAND on HOST as ssh would, by entering
# the namespaces of HOST's anchor process, with the environment of a fresh login (nothing forwarded).
host="$1"; shift
exec nsenter --target="$(cat {pids}/"$host")" --net --mount --uts --wd=/ -- \\
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root sh -c "$*"
"""


@dataclass
class LauncherCluster(NetnsCluster):
    """A :class:`NetnsCluster` whose hosts are hosts to Slurm, Open MPI and torchrun. ``build`` adds the anchors;
    :meth:`start_slurm` starts Slurm after the controller and agents."""

    anchors: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    slurm: Slurm | None = None

    @property
    def all_hosts(self) -> list[str]:
        return [HEAD, *self.shape.hosts]

    def host_address(self, host: str) -> str:
        return CONTROLLER_ADDRESS if host == HEAD else self.address(host)

    @property
    def rsh_agent(self) -> Path:
        return self.workdir / "rsh-agent"

    def build(self) -> None:
        super().build()
        pids = self.workdir / "pids"
        pids.mkdir(exist_ok=True)
        hosts_file = self.workdir / "etc-hosts"
        named = [f"{self.host_address(host)} {host}" for host in self.all_hosts]
        hosts_file.write_text("\n".join(["127.0.0.1 localhost", *named]) + "\n")
        self.config_dir.mkdir(exist_ok=True)
        # The host's address also on a real interface: Open MPI skips loopback devices, where netns.py puts it.
        self._add_address(self.controller_namespace, "h0", CONTROLLER_ADDRESS)
        for host in self.shape.hosts:
            self._add_address(self.namespace(host), "ctl", self.address(host))
        for host in self.all_hosts:
            self._anchor(host, hosts_file, pids / host)
        self.rsh_agent.write_text(_RSH_AGENT.format(pids=shlex.quote(str(pids))))
        self.rsh_agent.chmod(0o755)

    @staticmethod
    def _add_address(namespace: str, interface: str, address: str) -> None:
        subprocess.run(
            ["ip", "-n", namespace, "addr", "add", f"{address}/32", "dev", interface], check=True, timeout=30
        )

    def _anchor(self, host: str, hosts_file: Path, pid_file: Path) -> None:
        own = self.workdir / f"config-{host}"
        own.mkdir(exist_ok=True)
        ready = self.workdir / f"anchor-{host}.ready"
        namespace = self.controller_namespace if host == HEAD else self.namespace(host)
        argv = ["ip", "netns", "exec", namespace, "unshare", "--mount", "--uts", "--propagation", "private"]
        argv += ["sh", "-c", _ANCHOR, "anchor", host, str(hosts_file), str(own), str(self.config_dir), str(ready)]
        log = self.workdir / f"anchor-{host}.log"
        with log.open("ab") as handle:
            anchor = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=handle)
        self.anchors[host] = anchor
        wait_until(lambda: ready.exists() or anchor.poll() is not None, timeout=30, what=f"host {host}'s namespaces")
        if anchor.poll() is not None:
            raise RuntimeError(f"host {host}'s anchor exited {anchor.returncode}: {log.read_text(errors='replace')}")
        pid_file.write_text(f"{anchor.pid}\n")

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` on ``host`` (``"controller"`` is ``head``): in its network, UTS and mount namespaces."""
        anchor = self.anchors.get(HEAD if host == "controller" else host)
        if anchor is None:
            return super().exec_argv(host, argv)
        # Entering a mount namespace moves to its root: keep the caller's working directory, as ip netns exec does.
        enter = ["nsenter", f"--target={anchor.pid}", "--net", "--mount", "--uts", f"--wd={Path.cwd()}", "--"]
        return [*enter, *argv]

    def on_node(self, host: str, argv: Sequence[str]) -> list[str]:
        return self.exec_argv(host, argv)  # the host's own config dir is already mounted at the one path

    def mount_on(self, host: str, source: Path, target: Path) -> None:
        """Bind-mount ``source`` on ``target`` in ``host``'s mount namespace (undo with :meth:`unmount_on`)."""
        subprocess.run(self.exec_argv(host, ["mount", "--bind", str(source), str(target)]), check=True, timeout=30)

    def unmount_on(self, host: str, target: Path) -> None:
        subprocess.run(self.exec_argv(host, ["umount", str(target)]), check=True, timeout=30)

    def start_slurm(self) -> Slurm:
        """slurmctld on ``head``, a slurmd on every host, one munged (its socket is a path: every host reaches it)."""
        self.slurm = Slurm(
            self.workdir / "slurm",
            nodes={host: self.address(host) for host in self.shape.hosts},
            controller=(HEAD, CONTROLLER_ADDRESS),
            ctld_port=SLURMCTLD_PORT,
            slurmd_port=SLURMD_PORT,
            run_on=lambda host: self.exec_argv(host or HEAD, []),
        )
        self.slurm.start()
        return self.slurm

    def logs(self, tail: int = 3000) -> str:
        slurm = f"\n{self.slurm.logs()}" if self.slurm is not None else ""
        return super().logs(tail) + slurm

    def close(self) -> None:
        if self.slurm is not None:
            self.slurm.stop()
        super().close()  # kills the anchors with everything else in the namespaces
        for anchor in self.anchors.values():
            anchor.wait(timeout=10)
