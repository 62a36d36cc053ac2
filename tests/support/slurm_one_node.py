"""A real one-node Slurm 22.05 for tests: slurmctld and one slurmd on this machine (``tests/support/slurm.py``).

slurmd runs in a mount namespace of its own with an empty tmpfs on ``/sys/fs/cgroup`` (what 22.05's
cgroup/v1 plugin wants), so the host's cgroups are never touched; both daemons listen on 127.0.0.1.

Non-goals: several hosts (``tests/support/launcher_cluster.py`` does that), accounting, MPI plugins.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import free_port
from tests.support.slurm import Slurm, slurm_missing

__all__ = ["slurm_missing", "slurm_one_node"]

_OWN_CGROUP_TREE = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
_MOUNT_AND_RUN = 'mount -t tmpfs none /sys/fs/cgroup && exec "$@"'


def _run_on(node: str | None) -> Sequence[str]:
    # An empty cgroup tree of slurmd's own: 22.05's cgroup/v1 plugin wants one, the host's is left alone.
    return () if node is None else (*_OWN_CGROUP_TREE, _MOUNT_AND_RUN, "sh")


@contextmanager
def slurm_one_node(
    root: Path,
    *,
    node: str = "tt-node1",
    conf_lines: Sequence[str] = (),
    other_nodes: Sequence[str] = (),
    topology_conf: str = "",
) -> Iterator[Slurm]:
    """A started one-node :class:`Slurm` under ``root`` (``node``, with ``conf_lines`` in slurm.conf), stopped on
    leaving. ``other_nodes``: nodes slurm.conf names that have no slurmd (they stay down), for topology files."""
    slurm = Slurm(
        root,
        nodes={node: "127.0.0.1"},
        controller=("localhost", "127.0.0.1"),
        ctld_port=free_port(),
        slurmd_port=free_port(),
        run_on=_run_on,
        conf_lines=list(conf_lines),
        node_lines=[f"NodeName={name} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN" for name in other_nodes],
        node_hostname="localhost",
        topology_conf=topology_conf,
    )
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()
