"""The proof's statistics: bounds that cover at their level, a loss never shipped, gains Holm-corrected,
a sequential design that stops early without raising the error rate; and pinned numbers."""

from __future__ import annotations

import math
import random

import pytest

from topo_tune.errors import ConfigError
from topo_tune.tuner.statistics import Bounds, Decision, SequentialDesign, compare, decide, holm


def pairs(rng: random.Random, *, n: int, gain: float, cv: float, drift: float = 0.0) -> tuple[list[float], list[float]]:
    """Interleaved A B A B times: slow drift hits both sides of a pair alike."""
    a, b = [], []
    for i in range(n):
        level = 100.0 * (1 + drift * i)
        a.append(level * math.exp(rng.gauss(0, cv)))
        b.append(level / (1 + gain) * math.exp(rng.gauss(0, cv)))
    return a, b


def series(rng: random.Random, *, n: int, speedup: float, cv: float) -> list[tuple[float, float]]:
    a, b = pairs(rng, n=n, gain=speedup - 1, cv=cv)
    return list(zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------ decisions


def test_a_real_ten_percent_gain_is_faster_with_bounds_around_it() -> None:
    a, b = pairs(random.Random(1), n=10, gain=0.10, cv=0.02, drift=0.01)
    c = compare(a, b)
    assert decide([c]) == [Decision.FASTER]
    assert c.ci_low < 1.10 < c.ci_high and c.p_value < 0.01
    assert c.cv_baseline > 0.005 and c.pairs == 10


def test_equal_distributions_are_never_faster_over_many_seeds() -> None:
    faster = 0
    for seed in range(2000):
        a, b = pairs(random.Random(seed), n=10, gain=0.0, cv=0.05)
        faster += decide([compare(a, b)]) == [Decision.FASTER]
    assert faster == 0


def test_a_family_of_equal_buckets_stays_below_alpha_even_with_heavy_noise() -> None:
    families_with_a_false_win = 0
    for seed in range(300):
        rng = random.Random(seed)
        comparisons = [compare(*pairs(rng, n=8, gain=0.0, cv=0.15)) for _ in range(10)]
        families_with_a_false_win += Decision.FASTER in decide(comparisons, alpha=0.01)
    assert families_with_a_false_win <= 3  # Holm keeps the family-wise rate at alpha = 1%


def test_a_real_gain_below_the_minimum_effect_is_safe_but_not_faster() -> None:
    a, b = pairs(random.Random(3), n=12, gain=0.015, cv=0.002)
    c = compare(a, b)
    assert c.p_value < 0.01, "the gain is real ..."
    assert decide([c]) == [Decision.NO_DIFFERENCE], "... but smaller than the 3% minimum effect"


def test_a_significant_loss_is_slower_and_a_noisy_one_is_not_shown_safe() -> None:
    a, b = pairs(random.Random(4), n=10, gain=-0.2, cv=0.02)
    assert decide([compare(a, b)]) == [Decision.SLOWER]
    a, b = pairs(random.Random(4), n=10, gain=0.0, cv=0.10)
    c = compare(a, b)
    assert c.ci_low < 0.98 <= c.ci_high and decide([c]) == [Decision.NOT_SHOWN_SAFE]


def test_a_deterministic_backend_gives_certain_answers_in_both_directions() -> None:
    c = compare([10.0] * 4, [8.0] * 4)
    assert c.p_value == 0.0 and c.p_margin == 0.0 and c.speedup == pytest.approx(1.25) and c.ci_low == c.ci_high
    assert decide([c]) == [Decision.FASTER]
    slow = compare([10.0] * 4, [20.0] * 4)  # a 2x slowdown
    assert slow.p_value == 1.0 and slow.p_margin == 1.0 and decide([slow]) == [Decision.SLOWER]
    within = compare([10.0] * 4, [10.1] * 4)  # 1% slower: within maxLoss, no gain
    assert decide([within]) == [Decision.NO_DIFFERENCE]
    assert decide([within], max_loss=0.005) == [Decision.SLOWER]
    small = compare([10.0] * 4, [9.8] * 4)  # a certain 2% gain, below the 3% minimum effect
    assert small.p_value == 0.0 and small.p_margin == 1.0 and decide([small]) == [Decision.NO_DIFFERENCE]


def test_the_safety_boundary_is_inclusive_and_exactly_one_minus_max_loss() -> None:
    at = compare([100.0] * 3, [100.0 / 0.98] * 3)  # exactly 0.98, deterministic
    assert at.ci_low == pytest.approx(0.98)
    assert decide([at], max_loss=0.02 + 1e-9) == [Decision.NO_DIFFERENCE]
    assert decide([at], max_loss=0.02 - 1e-9) == [Decision.SLOWER]


def test_the_decision_boundaries_are_exact() -> None:
    floor = 1 - 0.02
    assert Bounds(floor, 1.1, False, 4).decision(0.02) is Decision.NO_DIFFERENCE, "a bound on the floor is safe"
    assert Bounds(floor, 1.1, True, 4).decision(0.02) is Decision.FASTER
    assert Bounds(0.5, floor, False, 4).decision(0.02) is Decision.NOT_SHOWN_SAFE, "an upper bound on it is not slower"
    assert Bounds(0.5, floor - 1e-12, True, 4).decision(0.02) is Decision.SLOWER, "slower even if a gain was seen"
    same = compare([10.0] * 3, [10.0] * 3)  # certain: no difference at all
    assert same.p_value == 1.0 and same.p_margin == 1.0 and same.speedup == 1.0


def test_safety_is_not_corrected_for_multiplicity_and_gains_are() -> None:
    # Twenty buckets, each with the same data: the safety decision of one bucket does not depend on how many
    # buckets there are (intersection-union), while a gain that clears alpha alone fails Holm over twenty.
    a, b = pairs(random.Random(7), n=10, gain=0.045, cv=0.012)
    c = compare(a, b)
    assert c.p_margin < 0.01 and c.ci_low >= 0.98
    assert decide([c]) == [Decision.FASTER]
    if c.p_margin > 0.01 / 20:
        assert decide([c] * 20) == [Decision.NO_DIFFERENCE] * 20
    else:  # pragma: no cover - the seed above makes this branch unreachable; kept for honesty if it changes
        pytest.fail("pick a seed whose gain clears alpha alone but not alpha / 20")


# ------------------------------------------------------------------------------------------ coverage


@pytest.mark.parametrize("true_speedup", [0.98, 1.07])
def test_the_lower_bound_covers_at_its_level_under_noise(true_speedup: float) -> None:
    above = 0
    seeds = 3000
    for seed in range(seeds):
        a, b = pairs(random.Random(seed), n=10, gain=true_speedup - 1, cv=0.04)
        above += compare(a, b, alpha=0.05).ci_low > true_speedup
    rate = above / seeds
    assert 0.035 <= rate <= 0.065, f"the one-sided 95% lower bound exceeds the truth {rate:.3%} of the time"


def test_a_measured_eight_percent_loss_is_never_shown_safe_at_any_seed() -> None:
    # Measured: whatever the noise and the pair count, a point estimate of 0.92 is never shipped.
    for seed in range(2000):
        rng = random.Random(seed)
        n = rng.choice((2, 3, 5, 10, 30))
        a, b = pairs(rng, n=n, gain=0.0, cv=rng.choice((0.001, 0.02, 0.1)))
        scale = compare(a, b).speedup / 0.92
        c = compare(a, [t * scale for t in b])
        assert c.speedup == pytest.approx(0.92)
        assert not decide([c])[0].safe, f"seed {seed}"
        assert (
            not SequentialDesign(2, max(n, 2))
            .bounds([list(zip(a, [t * scale for t in b], strict=True))])[0]
            .decision(0.02)
            .safe
        )
    # True: an 8% loss measured sequentially next to a clear win is never shown safe.
    design = SequentialDesign(first=4, max_pairs=30)
    for seed in range(400):
        rng = random.Random(seed)
        faster = series(rng, n=30, speedup=1.5, cv=0.05)
        loss = series(rng, n=30, speedup=0.92, cv=0.05)
        bounds = design.bounds([faster, loss])
        decisions = [b.decision(0.02) for b in bounds]
        assert decisions[0] is Decision.FASTER
        assert not decisions[1].safe, f"seed {seed}: an 8% loss was shown safe"


def test_the_sequential_running_bound_keeps_its_error_rate_where_naive_peeking_does_not() -> None:
    design = SequentialDesign(first=5, max_pairs=30, alpha=0.05)
    seeds = 1500
    sequential = naive = 0
    for seed in range(seeds):
        s = series(random.Random(seed), n=30, speedup=0.98, cv=0.03)  # on the boundary: the worst case
        sequential += design.bounds([s])[0].decision(0.02).safe
        # Repeated peeking: a fixed-size 95% bound at every look, stopping at the first "safe".
        naive += any(
            compare([a for a, _ in s[:n]], [b for _, b in s[:n]], alpha=0.05).ci_low >= 0.98 for n in design.looks
        )
    assert sequential / seeds <= 0.05, f"shown safe {sequential / seeds:.2%} of the time at alpha 5%"
    assert naive / seeds > 0.10, "peeking at a fixed-size test raises the error rate (why the design exists)"


# ------------------------------------------------------------------------------------------ sequential rule


def test_the_looks_and_the_alpha_spent_at_each() -> None:
    assert SequentialDesign(10, 30).looks == (10, 20, 30)
    assert SequentialDesign(10, 25).looks == (10, 20, 25)
    assert SequentialDesign(10, 10).looks == (10,)
    assert SequentialDesign(2, 30).looks == tuple(range(2, 31, 2))
    assert SequentialDesign(10, 30, alpha=0.01).alphas == pytest.approx((0.005, 0.0025, 0.0025))
    assert SequentialDesign(10, 10, alpha=0.01).alphas == (0.01,)
    many = SequentialDesign(2, 30, alpha=0.02).alphas
    assert many[0] == pytest.approx(0.01) and sum(many) == pytest.approx(0.02) and len(set(many[1:])) == 1
    assert SequentialDesign(10, 30).next_look(10) == 20
    assert SequentialDesign(10, 30).next_look(29) == 30
    assert SequentialDesign(10, 30).next_look(30) is None


def test_a_clear_bucket_is_decided_at_the_first_look_and_a_marginal_one_later() -> None:
    design = SequentialDesign(first=5, max_pairs=30)
    rng = random.Random(11)
    clear = series(rng, n=30, speedup=1.3, cv=0.01)
    marginal = series(rng, n=30, speedup=1.0, cv=0.02)
    hopeless = series(rng, n=30, speedup=0.97, cv=0.06)
    bounds = design.bounds([clear, marginal, hopeless])
    assert bounds[0].decided_at == 5 and bounds[0].decision(0.02) is Decision.FASTER
    assert 5 < bounds[1].decided_at < 30 and bounds[1].decision(0.02) is Decision.NO_DIFFERENCE
    assert bounds[2].decided_at == 30 and bounds[2].decision(0.02) is Decision.NOT_SHOWN_SAFE
    # A bucket measured only to the first look keeps the first look's answer and share of alpha.
    short = design.bounds([clear[:5]])[0]
    first_look = compare([a for a, _ in clear[:5]], [b for _, b in clear[:5]], alpha=0.005)
    assert short.decided_at == 5 and short.low == pytest.approx(first_look.ci_low)


def test_a_decided_bucket_keeps_its_decision_whatever_later_pairs_show() -> None:
    design = SequentialDesign(first=4, max_pairs=8)
    safe_first = [(100.0, 90.0)] * 4 + [(100.0, 200.0)] * 4  # certain at 4 pairs, awful afterwards
    bounds = design.bounds([safe_first])[0]
    assert bounds.decided_at == 4 and bounds.decision(0.02) is Decision.FASTER


def test_the_gain_test_counts_buckets_not_measured_to_a_look_in_holms_family() -> None:
    design = SequentialDesign(first=3, max_pairs=6, alpha=0.02)
    gain = [(100.0 * (1 + 0.001 * i), 95.0) for i in range(6)]  # ~5% gain, tiny noise
    one = design.bounds([gain])[0]
    with_short = design.bounds([gain, gain[:2]])
    assert one.faster and with_short[0].faster
    assert with_short[1].decided_at == 0 and not with_short[1].faster


# ------------------------------------------------------------------------------------------ pinned numbers


def test_the_bounds_use_the_t_quantile_with_n_minus_one_degrees_of_freedom() -> None:
    diffs = [0.05 + d for d in (-0.02, -0.01, 0.0, 0.01, 0.02, -0.02, -0.01, 0.0, 0.01, 0.02)]
    baseline = [100.0] * 10
    candidate = [100.0 / math.exp(d) for d in diffs]
    c = compare(baseline, candidate, alpha=0.01)
    sd = math.sqrt(sum((d - 0.05) ** 2 for d in diffs) / 9)
    se = sd / math.sqrt(10)
    t_99_9 = 2.821437925  # t(0.99, df=9)
    assert c.speedup == pytest.approx(math.exp(0.05))
    assert c.ci_low == pytest.approx(math.exp(0.05 - t_99_9 * se), rel=1e-9)
    assert c.ci_high == pytest.approx(math.exp(0.05 + t_99_9 * se), rel=1e-9)
    assert c.confidence == pytest.approx(0.99)
    t_95_9 = 1.833112933  # t(0.95, df=9)
    assert compare(baseline, candidate, alpha=0.05).ci_low == pytest.approx(math.exp(0.05 - t_95_9 * se), rel=1e-9)
    # p-values: t statistic mean / se with 9 degrees of freedom; against "no gain" and the 3% margin.
    assert c.p_value == pytest.approx(1.0935701e-06, rel=1e-6)
    assert c.p_margin == pytest.approx(9.4391286e-04, rel=1e-6)


def test_the_coefficient_of_variation_is_the_sample_one() -> None:
    c = compare([9.0, 10.0, 11.0], [18.0, 20.0, 22.0])
    assert c.cv_baseline == pytest.approx(0.1) and c.cv_candidate == pytest.approx(0.1)
    assert compare([9.0, 11.0], [10.0, 10.0]).cv_baseline == pytest.approx(math.sqrt(2) / 10)


def test_holm_is_holm_not_bonferroni_nor_stricter() -> None:
    # Holm's thresholds for m = 4 at 5%: 0.0125, 0.01667, 0.025, 0.05. Bonferroni rejects only the first;
    # alpha / (m - rank + 1) rejects none; Holm rejects all four.
    assert holm([0.011, 0.016, 0.024, 0.049], 0.05) == [True, True, True, True]
    assert holm([0.049, 0.024, 0.016, 0.011], 0.05) == [True, True, True, True]
    assert holm([0.011, 0.017, 0.024, 0.049], 0.05) == [True, False, False, False]
    assert holm([0.025, 0.05], 0.05) == [True, True], "p equal to its threshold is rejected"
    assert holm([0.001, 0.04, 0.004, 0.5], 0.05) == [True, False, True, False]
    assert holm([], 0.05) == []


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ConfigError, match=r"^candidate: needs one time per baseline time \(2\), got 1$"):
        compare([1.0, 2.0], [1.0])
    with pytest.raises(ConfigError, match=r"^baseline: needs at least 2 pairs, got 1$"):
        compare([1.0], [1.0])
    with pytest.raises(ConfigError, match=r"^candidate: times must be finite and > 0, got -2.0$"):
        compare([1.0, 2.0], [1.0, -2.0])
    with pytest.raises(ConfigError, match=r"^baseline: times must be finite and > 0, got inf$"):
        compare([1.0, math.inf], [1.0, 2.0])
    with pytest.raises(ConfigError, match=r"^candidate: times must be finite and > 0, got 0.0$"):
        compare([1.0, 2.0], [0.0, 2.0])
    with pytest.raises(ConfigError, match=r"^alpha: must be within \(0, 0.5\), got 0.9$"):
        decide([], alpha=0.9)
    with pytest.raises(ConfigError, match=r"^alpha: must be within \(0, 0.5\), got 0.0$"):
        compare([1.0, 2.0], [1.0, 2.0], alpha=0.0)
    with pytest.raises(ConfigError, match=r"^alpha: the comparisons' bounds are at 0.05, not 0.01$"):
        decide([compare([1.0, 2.0], [1.0, 2.0], alpha=0.05)], alpha=0.01)
    with pytest.raises(ConfigError, match=r"^min_effect: must be within \[0, 1\), got 1.0$"):
        compare([1.0, 2.0], [1.0, 2.0], min_effect=1.0)
    with pytest.raises(ConfigError, match=r"^max_loss: must be within \[0, 1\), got -0.01$"):
        decide([], max_loss=-0.01)
    with pytest.raises(ConfigError, match=r"^max_loss: must be within \[0, 1\), got 1.0$"):
        SequentialDesign(2, 4).bounds([], max_loss=1.0)
    with pytest.raises(ConfigError, match=r"^search.proofPairsMax: must be at least proofPairs \(10\), got 9$"):
        SequentialDesign(10, 9)
    with pytest.raises(ConfigError, match=r"^search.proofPairs: must be at least 2, got 1$"):
        SequentialDesign(1, 9)
    with pytest.raises(ConfigError, match=r"^alpha: "):
        SequentialDesign(2, 4, alpha=0.5)
    # The edges of each range are accepted.
    compare([1.0, 2.0], [1.0, 2.0], min_effect=0.0, alpha=0.49)
    SequentialDesign(2, 2)
    assert SequentialDesign(2, 4).bounds([]) == []


def test_unpaired_samples_get_welchs_bounds_on_log_times() -> None:
    from scipy import stats as scipy_stats

    from topo_tune.tuner.statistics import compare_unpaired

    baseline = [100.0, 104.0, 98.0, 101.0, 103.0, 99.0]
    candidate = [90.0, 95.0, 91.0, 89.0]
    c = compare_unpaired(baseline, candidate, alpha=0.05, min_effect=0.03)
    logs_b, logs_c = [math.log(v) for v in baseline], [math.log(v) for v in candidate]
    welch = scipy_stats.ttest_ind(logs_b, logs_c, equal_var=False, alternative="greater")
    assert c.p_value == pytest.approx(welch.pvalue)
    interval = welch.confidence_interval(confidence_level=0.95)
    assert c.ci_low == pytest.approx(math.exp(interval.low))
    assert c.ci_low < c.speedup < c.ci_high and c.pairs == 4
    with pytest.raises(ConfigError, match="candidate: needs at least 2 samples"):
        compare_unpaired(baseline, [90.0])
