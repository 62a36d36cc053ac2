"""The drift check's test: Welch's one-sided t-test on log bandwidth against a margin."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from topo_tune.controller.bandwidth_drop import drop_beyond
from topo_tune.errors import ValidationError


def test_it_is_welchs_test_on_logs_shifted_by_the_margin() -> None:
    rng = random.Random(3)
    for _ in range(20):
        reference = [40 * math.exp(rng.gauss(0, 0.03)) for _ in range(rng.randint(2, 12))]
        measured = [40 * rng.uniform(0.7, 1.0) * math.exp(rng.gauss(0, 0.05)) for _ in range(rng.randint(2, 6))]
        test = drop_beyond(reference, measured, margin=0.10)
        shifted = [math.log(m) - math.log(0.9) for m in measured]
        welch = stats.ttest_ind(shifted, [math.log(r) for r in reference], equal_var=False, alternative="less")
        assert test.p_value == pytest.approx(float(welch.pvalue), rel=1e-9)
        assert test.df == pytest.approx(float(welch.df), rel=1e-9)


def test_a_clear_drop_is_significant_and_the_same_drop_in_noise_is_not() -> None:
    reference = [40.0, 40.4, 39.6, 40.2, 39.8, 40.1, 39.9, 40.0]
    steady = drop_beyond(reference, [34.0, 34.2, 33.8], margin=0.10)  # -15%, tight
    assert steady.drop == pytest.approx(0.15, abs=0.005) and steady.p_value < 0.01
    noisy = drop_beyond(reference, [24.0, 44.0, 34.0], margin=0.10)  # about as low on average, all over
    assert noisy.drop > 0.10 and noisy.p_value > 0.05
    within = drop_beyond(reference, [37.0, 37.2, 36.8], margin=0.10)  # -7.5%: not beyond the margin
    assert within.p_value > 0.5


def test_a_single_reference_figure_is_taken_as_known() -> None:
    measured = [34.0, 34.5, 33.5]
    test = drop_beyond([40.0], measured, margin=0.10)
    logs = [math.log(m) - math.log(0.9 * 40.0) for m in measured]
    one_sample = stats.ttest_1samp(logs, 0.0, alternative="less")
    assert test.p_value == pytest.approx(float(one_sample.pvalue), rel=1e-9) and test.df == 2


def test_figures_without_spread_decide_by_the_sign() -> None:
    assert drop_beyond([40.0, 40.0], [30.0, 30.0], margin=0.10).p_value == 0.0
    assert drop_beyond([40.0, 40.0], [38.0, 38.0], margin=0.10).p_value == 1.0


def test_bad_input_names_the_side() -> None:
    with pytest.raises(ValidationError, match="measured: needs at least one"):
        drop_beyond([40.0], [], margin=0.1)
    with pytest.raises(ValidationError, match=r"reference: bandwidth figures must be finite and > 0, got 0\.0"):
        drop_beyond([0.0], [1.0], margin=0.1)
    with pytest.raises(ValidationError, match="margin"):
        drop_beyond([1.0], [1.0], margin=1.0)
