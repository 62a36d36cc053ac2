"""Gate verdicts on A/B samples: Argo semantics, thresholds, and the statistics behind them."""

from __future__ import annotations

import random

import pytest

from topo_tune.config.checks import overridden
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.rollout.gates import Outcome, Sample, check_reachable, judge, sign_flip_p
from topo_tune.errors import ValidationError


def ab(
    *, change: float, pairs: int = 10, noise: float = 0.005, p99_change: float | None = None, busbw_cv: float = 0.01
) -> list[Sample]:
    """Interleaved samples whose new arm is ``change`` slower (negative: faster) than the previous one."""
    rng = random.Random(42)
    out: list[Sample] = []
    p99 = change if p99_change is None else p99_change
    for repeat in range(pairs):
        base = 100.0 * (1 + rng.gauss(0, 0.02))  # drift between repeats, shared by both arms
        out.append(Sample(repeat, "previous", base * (1 + rng.gauss(0, noise)), 2 * base, 50.0))
        new_time = base * (1 + change) * (1 + rng.gauss(0, noise))
        out.append(Sample(repeat, "new", new_time, 2 * base * (1 + p99), 50.0 * (1 + rng.gauss(0, busbw_cv))))
    return out


def test_a_clear_gain_passes() -> None:
    verdict = judge(ab(change=-0.08), RolloutThresholdsConfig())
    assert verdict.outcome is Outcome.SUCCESSFUL, verdict.reasons
    assert verdict.time_change == pytest.approx(-0.08, abs=0.01)
    assert verdict.p_gain < 0.01


def test_a_gain_below_the_required_one_pauses() -> None:
    verdict = judge(ab(change=-0.01), RolloutThresholdsConfig())
    assert verdict.outcome is Outcome.INCONCLUSIVE
    assert "gain of 3% not shown" in verdict.reasons[0]
    assert judge(ab(change=-0.01), RolloutThresholdsConfig(min_gain=0.0)).outcome is Outcome.SUCCESSFUL, "configurable"


def test_a_slowdown_beyond_three_percent_fails() -> None:
    verdict = judge(ab(change=0.06), RolloutThresholdsConfig())
    assert verdict.outcome is Outcome.FAILED
    assert "communication time +6" in verdict.reasons[0]


def test_a_p99_increase_fails_even_when_the_mean_time_improves() -> None:
    verdict = judge(ab(change=-0.08, p99_change=0.2), RolloutThresholdsConfig())
    assert verdict.outcome is Outcome.FAILED
    assert "p99 latency +20" in verdict.reasons[0]


def test_unstable_throughput_pauses() -> None:
    verdict = judge(ab(change=-0.08, busbw_cv=0.2), RolloutThresholdsConfig())
    assert verdict.outcome is Outcome.INCONCLUSIVE
    assert any("throughput unstable" in r for r in verdict.reasons)


def test_a_lost_node_pauses_and_never_passes() -> None:
    verdict = judge(ab(change=-0.08), RolloutThresholdsConfig(), lost_nodes=["r1-n2"])
    assert verdict.outcome is Outcome.INCONCLUSIVE
    assert verdict.reasons == ("lost nodes: r1-n2",)
    assert judge(ab(change=0.1), RolloutThresholdsConfig(), lost_nodes=["x"]).outcome is Outcome.FAILED, "rollback wins"


def test_a_negative_min_gain_passes_a_version_shown_no_slower_than_the_margin() -> None:
    thresholds = RolloutThresholdsConfig(min_gain=-0.05)
    assert judge(ab(change=0.0), thresholds).outcome is Outcome.SUCCESSFUL, "no change: not inferior"
    slower = judge(ab(change=0.08, p99_change=0.0), RolloutThresholdsConfig(min_gain=-0.05, max_regression=0.1))
    assert slower.outcome is Outcome.INCONCLUSIVE, slower.reasons
    assert "slowdown of at most 5% not shown" in slower.reasons[0]
    with pytest.raises(ValidationError, match=r"thresholds\.min_gain: input should be greater than or equal to -0\.5"):
        overridden(RolloutThresholdsConfig(), {"min_gain": -0.6}, where="thresholds", error=ValidationError)


def test_a_wave_whose_bandwidth_falls_below_the_reference_fails_although_its_ab_passes() -> None:
    samples = ab(change=-0.08)  # the A/B alone passes: both arms share the wave's (slow) links
    on_par = judge(samples, RolloutThresholdsConfig(), reference_busbw=52.0)
    assert on_par.outcome is Outcome.SUCCESSFUL, on_par.reasons
    assert on_par.busbw_new == pytest.approx(50.0, rel=0.02) and on_par.reference_busbw == 52.0
    slow = judge(samples, RolloutThresholdsConfig(), reference_busbw=100.0)
    assert slow.outcome is Outcome.FAILED
    assert slow.busbw_drop == pytest.approx(0.5, abs=0.02) and slow.p_drop < 0.01
    assert "50% below the reference 100 GB/s" in slow.reasons[0]
    assert judge(samples, RolloutThresholdsConfig(max_drop=0.6), reference_busbw=100.0).outcome is Outcome.SUCCESSFUL
    assert judge(samples, RolloutThresholdsConfig()).reference_busbw == 0.0, "no reference: not compared"


def test_too_few_pairs_can_never_pass() -> None:
    verdict = judge(ab(change=-0.5, pairs=6), RolloutThresholdsConfig())
    assert verdict.outcome is Outcome.INCONCLUSIVE
    assert "at least 7" in verdict.reasons[0]


def test_a_verdict_short_of_pairs_counts_the_pairs_that_ran_of_the_repeats_asked_for() -> None:
    samples = [s for s in ab(change=-0.5, pairs=8) if not (s.repeat >= 2 and s.arm == "new")]  # 6 repeats failed
    verdict = judge(samples, RolloutThresholdsConfig(), repeats=8)
    assert verdict.pairs == 2
    assert verdict.reasons[0] == (
        "2 usable A/B pairs of 8 A/B repeats run (a repeat whose benchmark failed gives none); "
        "at least 7 are needed to reach p < 0.01"
    )


@pytest.mark.parametrize(("alpha", "least"), [(0.01, 7), (0.05, 5), (0.15, 3)])
def test_a_gate_that_can_never_reach_alpha_is_refused_naming_the_minimum(alpha: float, least: int) -> None:
    thresholds = RolloutThresholdsConfig(alpha=alpha)
    with pytest.raises(ValidationError, match=rf"gate.repeats: {least - 1} A/B repeats can never .* at least {least}"):
        check_reachable(RolloutGateConfig(repeats=least - 1), thresholds)
    check_reachable(RolloutGateConfig(repeats=least), thresholds)


def test_the_sign_flip_test_is_exact_and_calibrated() -> None:
    assert sign_flip_p([1.0] * 7) == pytest.approx(1 / 128)
    assert sign_flip_p([1.0] * 6) == pytest.approx(1 / 64)
    assert sign_flip_p([-1.0] * 5) == 1.0
    # Under the null, p < 0.05 about 5% of the time (both the exact and the sampled path).
    rng = random.Random(3)
    for n in (10, 20):
        hits = sum(sign_flip_p([rng.gauss(0, 1) for _ in range(n)], seed=i) < 0.05 for i in range(300))
        assert 5 <= hits <= 30, (n, hits)


def test_threshold_overrides_keep_the_rest_and_name_unknown_or_bad_keys() -> None:
    site = RolloutThresholdsConfig(max_cv=0.2)
    asked = overridden(site, {"min_gain": "0.05"}, where="thresholds", error=ValidationError)
    assert (asked.min_gain, asked.max_cv) == (0.05, 0.2)
    with pytest.raises(ValidationError, match=r"^thresholds\.gain: unknown key$"):
        overridden(site, {"gain": 0.05}, where="thresholds", error=ValidationError)
    with pytest.raises(ValidationError, match=r"^thresholds\.max_cv: input should be less than 1$"):
        overridden(site, {"max_cv": 1.5}, where="thresholds", error=ValidationError)


def test_malformed_samples_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"samples\.arm"):
        judge([Sample(0, "canary", 1, 1, 1)], RolloutThresholdsConfig())
    with pytest.raises(ValidationError, match=r"samples\.repeat"):
        judge([Sample(0, "new", 1, 1, 1), Sample(0, "new", 1, 1, 1)], RolloutThresholdsConfig())
