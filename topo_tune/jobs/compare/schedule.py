"""The arm schedule of a job's A/B: which arm each of the ``2 × pairs`` runs uses, the same on every node.

Every node of the job derives the schedule from the job id alone, so the nodes need not talk to each other
to run the same arm at the same time: the user's launcher (torchrun, srun, mpirun) starts ``exec --compare``
on each node, and the job's command itself synchronises each run (its rendezvous waits for every node).

The runs come in blocks of two pairs, ABBA or BAAB, the block's first arm chosen by a SHA-256 of the job id
and the block's number. Each pair holds one run of each arm, so the paired ratios cancel slow drift of the
machine (a warming cache, a neighbour's job) as the tuner's proof does; ABBA also cancels a linear drift
within the block, and the hashed choice keeps a periodic effect (every other run slower) from lining up with
one arm. Balanced: each arm runs exactly ``pairs`` times. Python's ``hash`` is not used: it is salted per
process, and the whole point is that separate processes agree.

Non-goals: running the command (the CLI), the statistics (``summary``).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from topo_tune.errors import ConfigError

MAX_PAIRS = 1000
"""More pairs than any job would run: a typo's 10000 would otherwise keep a cluster busy for days."""


class Arm(enum.Enum):
    CANDIDATE = "candidate"
    """The arm named by ``--compare``."""
    AGAINST = "against"
    """The arm named by ``--against``."""

    @property
    def other(self) -> Arm:
        return Arm.AGAINST if self is Arm.CANDIDATE else Arm.CANDIDATE


@dataclass(frozen=True)
class Run:
    """One run of the job's command: its place in the schedule, its pair, and its arm."""

    index: int
    """0-based position in the schedule."""
    pair: int
    """0-based pair number: runs ``2 * pair`` and ``2 * pair + 1`` form it."""
    arm: Arm


def _block_starts_with_candidate(job_id: str, block: int) -> bool:
    digest = hashlib.sha256(f"topo-tune compare\0{job_id}\0{block}".encode()).digest()
    return digest[0] & 1 == 0


def arm_schedule(job_id: str, pairs: int) -> tuple[Run, ...]:
    """The ``2 × pairs`` runs in the order every node runs them."""
    if not job_id:
        raise ConfigError("--job-id", "the comparison's schedule is derived from the job id; none was given")
    if not 2 <= pairs <= MAX_PAIRS:
        raise ConfigError("--pairs", f"must be within [2, {MAX_PAIRS}] (two pairs at least for a CI), got {pairs}")
    runs: list[Run] = []
    for pair in range(pairs):
        block, second = divmod(pair, 2)
        first = Arm.CANDIDATE if _block_starts_with_candidate(job_id, block) else Arm.AGAINST
        if second:
            first = first.other  # ABBA: the block's second pair mirrors its first
        for arm in (first, first.other):
            runs.append(Run(index=len(runs), pair=pair, arm=arm))
    return tuple(runs)
