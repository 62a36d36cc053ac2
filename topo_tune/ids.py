"""What an identifier is: one ``NewType`` per kind of id, so ``mypy --strict`` refuses a node name where a
config version id belongs (and every other such mix-up).

Values become these types where they enter the domain: a servicer reading a request, a row read back, the CLI
parsing an argument. They are plain ``str`` at run time (no checks, no cost). Non-goals: what makes an id
valid (``controller/names.py``, cluster.yaml's schema), how ids are minted.
"""

from __future__ import annotations

from typing import NewType

__all__ = [
    "NO_CONFIG_VERSION",
    "NO_ROLLOUT",
    "BucketName",
    "ConfigVersionId",
    "JobId",
    "NodeName",
    "RolloutId",
    "StudyId",
]

NodeName = NewType("NodeName", str)
"""A node as its agent registers it and cluster.yaml names it (an RFC 1123 host name)."""

ConfigVersionId = NewType("ConfigVersionId", str)
"""A content-addressed config version (``cv-…``): the id of the files a node stages and a job is pinned to."""

RolloutId = NewType("RolloutId", str)
"""A rollout of one config version across the fleet, in waves."""

JobId = NewType("JobId", str)
"""A benchmark job's id (``bj-…`` or client-chosen): never a scheduler job or a user's training job."""

StudyId = NewType("StudyId", str)
"""A controller-run study (the id ``topo-tune admin study`` names it by)."""

BucketName = NewType("BucketName", str)
"""A size bucket of the tuner's objective (``0-1K`` … ``16M-4G``), as a workload's weights name it."""

NO_CONFIG_VERSION = ConfigVersionId("")
"""The empty version id: no config version, NCCL's defaults (a node that applied none, a job pinned to none)."""

NO_ROLLOUT = RolloutId("")
"""The empty rollout id: no rollout (a job pinned while none ran)."""
