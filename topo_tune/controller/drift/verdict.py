"""A drift check's verdict: its status, and the one-line message an operator reads in ``admin drift show``.

A check regresses when the bandwidth fell by more than ``threshold`` against the reference and that drop is
significant (``bandwidth_drop``: a one-sided Welch test on log bandwidth of the check's jobs against the
gate's samples, p < ``alpha``). Fewer than two usable jobs decide nothing: the check fails. Pure: no
database, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import fmean

from topo_tune.config.cluster import DriftConfig
from topo_tune.controller.bandwidth_drop import drop_beyond
from topo_tune.ids import NodeName, RolloutId


class DriftStatus(StrEnum):
    RUNNING = "running"
    OK = "ok"
    REGRESSED = "regressed"
    FAILED = "failed"
    """The benchmark ran but gave no usable figure (every job failed or timed out)."""
    SKIPPED = "skipped"
    """Nothing was measured: a rollout is active, no reference, too few idle nodes."""
    CHANGED = "changed"
    """A node's topology fingerprint changed when it registered again."""


class DriftKind(StrEnum):
    BENCHMARK = "benchmark"
    TOPOLOGY = "topology"


@dataclass(frozen=True)
class Reference:
    """What a rollout's gate measured for its new version on one wave."""

    rollout_id: RolloutId
    wave: int
    nodes: tuple[NodeName, ...]
    busbw_gbps: float
    """The mean of ``samples``."""
    samples: tuple[float, ...] = ()
    """The gate's ``new``-arm figures, one per A/B repeat: the test's reference side."""


@dataclass(frozen=True)
class DriftVerdict:
    status: DriftStatus
    message: str
    measured_busbw_gbps: float | None
    p_value: float | None
    simulated: bool


def drop_of(*, reference: float, measured: float) -> float:
    """The fraction of the reference bandwidth lost (negative: faster than the reference)."""
    return 1.0 - measured / reference


def judge(
    reference: Reference, measured: Sequence[float], *, failure: str, simulated: bool, settings: DriftConfig
) -> DriftVerdict:
    """The verdict on ``measured`` (one bus bandwidth per usable job) against ``reference``; ``failure`` says
    why a job gave no figure ("" when all did)."""
    busbw: float | None = None
    p_value: float | None = None
    if len(measured) >= 2:
        busbw = fmean(measured)
        drop = drop_of(reference=reference.busbw_gbps, measured=busbw)
        test = drop_beyond(reference.samples or (reference.busbw_gbps,), measured, margin=settings.threshold)
        p_value, alpha, threshold = test.p_value, settings.alpha, settings.threshold
        regressed = drop > threshold and p_value < alpha
        status = DriftStatus.REGRESSED if regressed else DriftStatus.OK
        if regressed:
            verdict = f"beyond the -{threshold:.0%} threshold, p = {p_value:.2g} < {alpha:g}"
        elif drop > threshold:
            verdict = f"beyond the -{threshold:.0%} threshold but within noise, p = {p_value:.2g} >= {alpha:g}"
        else:
            verdict = f"within the -{threshold:.0%} threshold"
        message = (
            f"bus bandwidth {busbw:.2f} GB/s vs {reference.busbw_gbps:.2f} GB/s at rollout "
            f"{reference.rollout_id} wave {reference.wave}: {-drop:+.1%} ({verdict}; "
            f"{len(measured)} vs {len(reference.samples) or 1} measurements)"
        )
        if failure:
            message += f"; {len(measured)} of {settings.repeats} jobs usable ({failure})"
    elif measured:
        status = DriftStatus.FAILED
        message = f"1 of {settings.repeats} jobs usable ({failure}): a decision needs at least 2"
    else:
        status, message = DriftStatus.FAILED, failure or "no job gave a usable figure"
    if simulated:
        message += " [simulated]"
    return DriftVerdict(status, message, busbw, p_value, simulated)
