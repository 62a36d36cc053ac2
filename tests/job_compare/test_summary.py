"""The figures of a job's A/B: the tuner's proof statistics over the paired runs, oriented so > 1 is better."""

from __future__ import annotations

import pytest

from topo_tune.errors import ValidationError
from topo_tune.jobs.compare.schedule import Arm, arm_schedule
from topo_tune.jobs.compare.summary import RunValue, summarise
from topo_tune.tuner import statistics


def _runs(job_id: str, pairs: int, candidate: list[float], against: list[float]) -> list[RunValue]:
    values = {Arm.CANDIDATE: iter(candidate), Arm.AGAINST: iter(against)}
    return [RunValue(r.index, r.pair, r.arm, next(values[r.arm])) for r in arm_schedule(job_id, pairs)]


CANDIDATE = [1.00, 1.02, 0.99, 1.01, 1.00, 0.98]
AGAINST = [2.01, 1.98, 2.03, 2.00, 1.97, 2.02]


def test_a_halved_step_time_is_a_gain_of_two_shown_faster() -> None:
    figures = summarise(_runs("j", 6, CANDIDATE, AGAINST), higher_is_better=False)
    direct = statistics.compare(AGAINST, CANDIDATE)  # the proof's own call: baseline first
    assert figures.gain == pytest.approx(direct.speedup) and 1.95 < figures.gain < 2.05
    assert (figures.ci_low, figures.ci_high, figures.p_value) == pytest.approx(
        (direct.ci_low, direct.ci_high, direct.p_value)
    )
    assert figures.ci_low < figures.gain < figures.ci_high
    assert figures.confidence == pytest.approx(0.98)
    assert figures.decision is statistics.Decision.FASTER
    assert (figures.candidate_median, figures.against_median) == (1.00, 2.005)


def test_higher_is_better_turns_the_ratio_around() -> None:
    figures = summarise(_runs("j", 6, CANDIDATE, AGAINST), higher_is_better=True)
    assert 0.48 < figures.gain < 0.52
    assert figures.decision is statistics.Decision.SLOWER


def test_equal_arms_show_no_difference_or_cannot_rule_out_a_loss() -> None:
    same = [1.0, 1.001, 0.999, 1.0]
    figures = summarise(_runs("j", 4, same, list(reversed(same))), higher_is_better=False)
    assert figures.decision in (statistics.Decision.NO_DIFFERENCE, statistics.Decision.NOT_SHOWN_SAFE)


def test_incomplete_pairs_are_refused_naming_the_pair() -> None:
    runs = _runs("j", 3, CANDIDATE[:3], AGAINST[:3])
    with pytest.raises(ValidationError, match=r"^runs: pair 1 is not complete"):
        summarise([r for r in runs if r.pair != 1 or r.arm is Arm.AGAINST], higher_is_better=False)
    with pytest.raises(ValidationError, match=r"^runs: pair 0 has two candidate runs"):
        summarise([*runs, RunValue(9, 0, Arm.CANDIDATE, 1.0)], higher_is_better=False)
    with pytest.raises(ValidationError, match="at least 2 pairs"):
        summarise(runs[:2], higher_is_better=False)
