"""A drift check as the controller stores it and the admin client reads it back: one domain type for both.

Non-goals: running checks and their verdicts (``controller/drift/``), the wire form (``wire/drift_checks.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class DriftCheck:
    """One drift check as stored: what it compared, and the verdict once it ended."""

    check_id: str
    kind: str
    """benchmark, topology"""
    status: str
    """running, ok, regressed, failed, skipped, changed"""
    message: str
    config_version: str
    rollout_id: str
    """Whose gate measured the reference."""
    nodes: tuple[str, ...]
    job_ids: tuple[str, ...]
    study_id: str
    simulated: bool
    created_at: datetime
    finished_at: datetime | None = None
    wave: int | None = None
    reference_busbw_gbps: float | None = None
    measured_busbw_gbps: float | None = None
    threshold: float | None = None
    """The drop (fraction of the reference) that counts as a regression."""
    p_value: float | None = None
    alpha: float | None = None

    @property
    def busbw_change(self) -> float | None:
        """Measured over reference bus bandwidth, less one (negative: slower); None before both are known."""
        if self.reference_busbw_gbps is None or self.measured_busbw_gbps is None:
            return None
        return self.measured_busbw_gbps / self.reference_busbw_gbps - 1
