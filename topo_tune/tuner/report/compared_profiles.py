"""Which two per-size profiles the report compares: NCCL's defaults and the tuned (or closest) configuration.

Purpose: one answer for the page's tables and its figures, from the study's outcome alone, without the
drawing library (the controller renders tables for studies it runs and imports this on start-up).

Non-goals: drawing (``figures``) and statistics (the proof's bounds come as given).
"""

from __future__ import annotations

from typing import Any

from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.study import StudyOutcome


def _shown_proof(outcome: StudyOutcome) -> Any:
    return outcome.chosen or max(outcome.proofs, key=lambda p: p.speedup, default=None)


def compared_profiles(outcome: StudyOutcome) -> tuple[Measurements | None, Measurements | None]:
    """The defaults and the tuned (or closest) configuration per size: the proof's per-size geometric means
    over its pairs when there is a proof, else the search's baseline and best trial."""
    proof = _shown_proof(outcome)
    if proof is not None and proof.baseline is not None and proof.candidate is not None:
        return proof.baseline, proof.candidate
    return outcome.baseline.measurements, outcome.best.measurements if outcome.best is not None else None
