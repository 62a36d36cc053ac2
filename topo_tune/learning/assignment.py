"""Which arm a job runs: a pure function of the version and the job's id, the same on every rank.

Every rank of a communicator must make the same choice for the same call, or NCCL hangs: the tuner is asked
once per merged bin at enqueue time and NCCL does no agreement between ranks. So the arm is chosen once per
job, from values every rank of the job holds identically (the config version's id, which seeds the draw,
and the job's id), and never from time, rank, host, process or Python's per-process hash seed. The job's
pin then carries that one arm for the job's whole life (``docs/learning.md``).

The draw: SHA-256 over a fixed tag, the version id and the job id; its first 8 bytes as a fraction in
[0, 1). Below the exploration's share the job runs a challenger (the fraction picks which, uniformly);
otherwise it runs the version's chosen table. Off unless the cluster's switch is on, the version's kill
switch is off and the job did not opt out.

Non-goals: storing the pin (the controller does), the tables themselves (``candidates``), timing the arms.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NewType

from topo_tune.errors import ConfigError
from topo_tune.ids import ConfigVersionId

__all__ = [
    "CHOSEN_ARM",
    "JOB_OPT_OUT_ENV",
    "MAX_EXPLORE_SHARE",
    "ArmIndex",
    "Exploration",
    "LearningSwitches",
    "assign_arm",
    "job_opted_out",
]

ArmIndex = NewType("ArmIndex", int)
"""0: the version's chosen table; 1..n: its n challengers, in the order the version lists them."""

CHOSEN_ARM = ArmIndex(0)

JOB_OPT_OUT_ENV = "TOPO_TUNE_LEARNING"
"""A job that sets this to ``off`` runs the chosen table whatever the cluster and version say."""

MAX_EXPLORE_SHARE = 0.5
"""At most half the jobs explore: the chosen table stays what most jobs run, so its record stays the largest."""

_TAG = b"topo-tune learning arm 1\0"
_FRACTION_BITS = 64


@dataclass(frozen=True, slots=True)
class Exploration:
    """What a version explores: how many challengers it carries and the share of jobs that run one."""

    version: ConfigVersionId
    """Seeds the draw: identical on every rank, and a new version draws anew."""
    challengers: int
    share: float
    """The fraction of jobs that run a challenger (all challengers together)."""

    def __post_init__(self) -> None:
        if not self.version:
            raise ConfigError("version", "exploring needs a config version (NCCL's defaults carry no tables)")
        if self.challengers < 0:
            raise ConfigError("challengers", f"must be 0 or more, got {self.challengers}")
        if not 0.0 <= self.share <= MAX_EXPLORE_SHARE:
            raise ConfigError("share", f"must be within [0, {MAX_EXPLORE_SHARE}], got {self.share}")


@dataclass(frozen=True, slots=True)
class LearningSwitches:
    """The two switches above a job's own opt-out; learning is off unless the first is on and the second off."""

    cluster_enabled: bool = False
    """The cluster's one switch (``learning.enabled`` in cluster.yaml); off by default."""
    version_stopped: bool = False
    """The version's kill switch: once set, every new job of the version runs its chosen table."""


def job_opted_out(job_env: Mapping[str, str]) -> bool:
    """True when the job set ``TOPO_TUNE_LEARNING=off`` (case and surrounding blanks ignored)."""
    return job_env.get(JOB_OPT_OUT_ENV, "").strip().lower() == "off"


def draw(version: ConfigVersionId, job_id: str) -> float:
    """The job's fraction in [0, 1): the same in every process, on every host, for the same two strings."""
    digest = hashlib.sha256(_TAG + version.encode() + b"\0" + job_id.encode()).digest()
    return int.from_bytes(digest[: _FRACTION_BITS // 8], "big") / float(1 << _FRACTION_BITS)


def assign_arm(
    exploration: Exploration, job_id: str, *, switches: LearningSwitches, job_env: Mapping[str, str]
) -> ArmIndex:
    """The arm the job runs for its whole life: ``CHOSEN_ARM`` or a challenger's index (1-based).

    ``job_env`` is the job's own environment as the job launcher saw it: every rank was started with it,
    so the opt-out reads the same on all of them.

    Raises:
        ConfigError: an empty job id (a job without an id cannot be pinned, so it cannot explore).
    """
    if not job_id:
        raise ConfigError("job_id", "a job needs an id to be assigned an arm")
    if (
        not switches.cluster_enabled
        or switches.version_stopped
        or job_opted_out(job_env)
        or exploration.challengers == 0
    ):
        return CHOSEN_ARM
    fraction = draw(exploration.version, job_id)
    if fraction >= exploration.share:
        return CHOSEN_ARM
    # Below the share, the same fraction rescaled picks a challenger uniformly.
    index = int(fraction / exploration.share * exploration.challengers)
    return ArmIndex(1 + min(index, exploration.challengers - 1))
