"""The proof: real gains are promoted, equal distributions never are, losses are flagged."""

from __future__ import annotations

import math
import random

import pytest

from topo_tune.errors import ConfigError
from topo_tune.tuner.statistics import Decision, compare, decide, holm


def pairs(rng: random.Random, *, n: int, gain: float, cv: float, drift: float = 0.0) -> tuple[list[float], list[float]]:
    """Interleaved A B A B times: slow drift hits both sides of a pair alike."""
    a, b = [], []
    for i in range(n):
        level = 100.0 * (1 + drift * i)
        a.append(level * math.exp(rng.gauss(0, cv)))
        b.append(level / (1 + gain) * math.exp(rng.gauss(0, cv)))
    return a, b


def test_a_real_ten_percent_gain_is_promoted_with_a_ci_around_it() -> None:
    a, b = pairs(random.Random(1), n=10, gain=0.10, cv=0.02, drift=0.01)
    c = compare(a, b)
    assert decide([c]) == [Decision.PROMOTE]
    assert c.ci_low < 1.10 < c.ci_high and c.p_value < 0.01
    assert c.cv_baseline > 0.005 and c.pairs == 10


def test_equal_distributions_never_promote_over_many_seeds() -> None:
    promoted = 0
    for seed in range(2000):
        a, b = pairs(random.Random(seed), n=10, gain=0.0, cv=0.05)
        promoted += decide([compare(a, b)]) == [Decision.PROMOTE]
    assert promoted == 0


def test_a_family_of_equal_buckets_stays_below_alpha_even_with_heavy_noise() -> None:
    families_with_a_false_win = 0
    for seed in range(300):
        rng = random.Random(seed)
        comparisons = [compare(*pairs(rng, n=8, gain=0.0, cv=0.15)) for _ in range(10)]
        families_with_a_false_win += Decision.PROMOTE in decide(comparisons, alpha=0.01)
    assert families_with_a_false_win <= 3  # Holm keeps the family-wise rate at alpha = 1%


def test_a_gain_below_the_minimum_effect_keeps_the_defaults() -> None:
    a, b = pairs(random.Random(3), n=12, gain=0.015, cv=0.002)
    c = compare(a, b)
    assert c.p_value < 0.01, "the gain is real ..."
    assert decide([c]) == [Decision.KEEP_DEFAULTS], "... but smaller than the 3% minimum effect"


def test_a_significant_loss_is_a_regression() -> None:
    a, b = pairs(random.Random(4), n=10, gain=-0.2, cv=0.02)
    assert decide([compare(a, b)]) == [Decision.REGRESSION]


def test_a_deterministic_backend_gives_certain_answers() -> None:
    c = compare([10.0] * 4, [8.0] * 4)
    assert c.p_value == 0.0 and c.speedup == pytest.approx(1.25) and c.ci_low == c.ci_high
    assert decide([c]) == [Decision.PROMOTE]


def test_holm_rejects_in_order_and_stops_at_the_first_failure() -> None:
    assert holm([0.001, 0.04, 0.004, 0.5], 0.05) == [True, False, True, False]


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ConfigError, match=r"candidate"):
        compare([1.0, 2.0], [1.0])
    with pytest.raises(ConfigError, match=r"baseline"):
        compare([1.0], [1.0])
    with pytest.raises(ConfigError, match=r"candidate"):
        compare([1.0, 2.0], [1.0, -2.0])
    with pytest.raises(ConfigError, match=r"alpha"):
        decide([], alpha=0.9)
