"""The controller's answer to a job that asks for its config: the pinned version, the node order and why.

``env``, ``exec``, ``hostfile`` and the Slurm task prolog read this value, never the admin API's message: the
client converts the answer at its edge (``wire/job_configs.py``) and checks its names before anything here is
written or run (``client/job_answer.py``). The controller builds the same value from its pin
(``controller/api/messages.py``), so both sides of the wire share one field list.

Non-goals: choosing the version or the order (``jobs/config.py``, ``tuner/ring/job_order.py``); the variables
a rank gets from it (``jobs/config.py``'s ``job_environment`` and ``order_environment``).
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.ids import NO_CONFIG_VERSION, NO_ROLLOUT, ConfigVersionId, NodeName, RolloutId
from topo_tune.jobs.config import LearningPin


@dataclass(frozen=True)
class JobConfig:
    """A job's config for one arm, as pinned (or, for a preview, as it would be pinned)."""

    job_id: str
    """The pinned job's id; "" for a preview that names no job."""
    config_version: ConfigVersionId = NO_CONFIG_VERSION
    """``NO_CONFIG_VERSION``: NCCL's defaults."""
    files: tuple[str, ...] = ()
    """The file names the version holds (``versions.version.FILE_NAMES``)."""
    nodes: tuple[NodeName, ...] = ()
    """The nodes the pin covers."""
    rollout_id: RolloutId = NO_ROLLOUT
    node_order: tuple[NodeName, ...] = ()
    """Node rank i runs on ``node_order[i]``; pinned with the job."""
    master_addr: str = ""
    """The address ``node_order[0]``'s agent registered (else its name)."""
    order_method: str = ""
    """How the order was chosen: a key of ``tuner.ring.job_order.METHODS``."""
    order_bottleneck_gbps: float | None = None
    """The predicted ring bottleneck of ``node_order`` (GB/s); inf for one node; None when the matrix cannot
    tell."""
    given_bottleneck_gbps: float | None = None
    """The same for the launcher's order (the nodes sorted by name)."""
    measured_edges: int = 0
    """Edges of ``node_order``'s ring whose pair was measured, of ``ring_edges``."""
    ring_edges: int = 0
    warnings: tuple[str, ...] = ()
    """What the controller tells the job's user, e.g. nodes the version's pair matrix does not know."""
    arm: str = ""
    """The arm asked for: "" the job's own config, else a version id, "stable" or "defaults"."""
    learning: LearningPin | None = None
    """The table the job runs and how often it is timed when it learns; None: it does not learn."""
