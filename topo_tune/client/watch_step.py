"""One change of something the admin client watches (a job, probe round, drift check, rollout or study).

The watch stream's update, converted at the client's edge: the thing as it now stands and how many of its
parts are done. Non-goals: following the stream (``admin.AdminClient``), printing progress (the CLI's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class WatchStep(Generic[T]):
    value: T
    done: int
    """Parts ended so far (benchmark jobs, pairs, trials), of ``total``."""
    total: int
