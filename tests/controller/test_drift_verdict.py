"""A drift check's verdict from its figures: regressed only when the drop is beyond the threshold and significant."""

from __future__ import annotations

import pytest

from topo_tune.config.cluster import DriftConfig
from topo_tune.controller.drift.verdict import DriftStatus, Reference, judge

SETTINGS = DriftConfig(threshold=0.10, alpha=0.05, repeats=3)
STEADY = Reference("ro-1", 0, ("a", "b"), 100.0, (99.0, 100.0, 101.0))


@pytest.mark.parametrize(
    ("measured", "reference", "status", "says"),
    [
        ([79.0, 80.0, 81.0], STEADY, DriftStatus.REGRESSED, "-20.0% (beyond the -10% threshold, p = "),
        ([97.0, 98.0, 99.0], STEADY, DriftStatus.OK, "-2.0% (within the -10% threshold; 3 vs 3 measurements)"),
        (
            [60.0, 85.0, 110.0],
            Reference("ro-1", 0, ("a", "b"), 100.0, (60.0, 100.0, 140.0)),
            DriftStatus.OK,
            "beyond the -10% threshold but within noise",
        ),
    ],
)
def test_the_status_and_message_follow_the_figures(
    measured: list[float], reference: Reference, status: DriftStatus, says: str
) -> None:
    verdict = judge(reference, measured, failure="", simulated=False, settings=SETTINGS)
    assert verdict.status is status
    assert says in verdict.message
    assert verdict.measured_busbw_gbps == pytest.approx(sum(measured) / len(measured))
    assert verdict.p_value is not None


def test_fewer_than_two_usable_jobs_decide_nothing() -> None:
    one = judge(STEADY, [50.0], failure="job dc-1-1: timed out", simulated=False, settings=SETTINGS)
    assert (one.status, one.measured_busbw_gbps, one.p_value) == (DriftStatus.FAILED, None, None)
    assert one.message == "1 of 3 jobs usable (job dc-1-1: timed out): a decision needs at least 2"
    none = judge(STEADY, [], failure="", simulated=True, settings=SETTINGS)
    assert (none.status, none.message) == (DriftStatus.FAILED, "no job gave a usable figure [simulated]")


def test_a_partial_check_says_how_many_jobs_counted() -> None:
    verdict = judge(STEADY, [99.0, 100.0], failure="job dc-1-2: failed", simulated=False, settings=SETTINGS)
    assert verdict.status is DriftStatus.OK
    assert verdict.message.endswith("; 2 of 3 jobs usable (job dc-1-2: failed)")
