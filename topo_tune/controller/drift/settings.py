"""How drift checks run: interval, sample size, threshold, significance, repeats, whether to open a study."""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.errors import ValidationError


@dataclass(frozen=True)
class DriftSettings:
    interval_s: float = 6 * 3600.0
    """How often the active version is re-measured; 0 turns the periodic check off."""
    sample_nodes: int = 2
    """Nodes measured per check, all from one wave of the version's rollout (where its reference comes from)."""
    threshold: float = 0.10
    """A drop in bus bandwidth beyond this fraction of the reference is a regression."""
    open_study: bool = False
    """Open a study over the ready nodes on a regression or a changed topology."""
    repeats: int = 3
    """Benchmark jobs per check; the check's figure is their mean, and each is one sample of the test."""
    alpha: float = 0.05
    """Significance level: a drop beyond ``threshold`` is a regression only when the test says so at this
    level (an alert, not a gate: a false alarm costs a look, a missed one a slow fleet)."""

    def __post_init__(self) -> None:
        if self.interval_s < 0:
            raise ValidationError("drift.interval", f"must be >= 0 (0: off), got {self.interval_s:g}")
        if self.sample_nodes < 1:
            raise ValidationError("drift.sampleNodes", f"must be >= 1, got {self.sample_nodes}")
        if not 0 < self.threshold < 1:
            raise ValidationError("drift.threshold", f"a fraction between 0 and 1, got {self.threshold:g}")
        if self.repeats < 2:
            raise ValidationError("drift.repeats", f"must be >= 2 (a test needs a spread), got {self.repeats}")
        if not 0 < self.alpha < 0.5:
            raise ValidationError("drift.alpha", f"a significance level between 0 and 0.5, got {self.alpha:g}")
