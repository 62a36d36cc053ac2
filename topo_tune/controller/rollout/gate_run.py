"""One run of a wave's gate: which rollout, wave and attempt, on which nodes, the two versions, measured how.

The engine builds one per gate it runs and hands it to its verifier; a verifier derives everything it needs
(its job ids, the arms' versions, the benchmark's sizes) from it, so a resumed controller that runs the same
gate again builds an equal object and finds the same jobs.

Non-goals: running the benchmark (``verification.py``) and judging it (``gates.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.config.cluster import RolloutGateConfig
from topo_tune.ids import ConfigVersionId, RolloutId


@dataclass(frozen=True)
class GateRun:
    rollout_id: RolloutId
    wave: int
    attempt: int
    nodes: tuple[str, ...]
    """The wave's nodes, in its rank order."""
    new: ConfigVersionId
    """The version being rolled out ("" would be NCCL's defaults)."""
    previous: ConfigVersionId
    """The version it replaces ("": NCCL's defaults)."""
    measurement: RolloutGateConfig
