"""Which searched trials the proof re-measures: the best, the tables, those that looked safe, the rest."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial

from topo_tune.tuner.finalists import (
    MIN_REPEATS,
    NOISE_Z,
    SEARCH_SLACK,
    choose_finalists,
    looked_safe,
    search_noise,
    shortfall,
)
from topo_tune.tuner.objective import Measurements, Objective, SizeSample, WorkloadProfile
from topo_tune.tuner.trial_store import A_MEASUREMENTS, A_ROLE, A_TABLE

OBJECTIVE = Objective(WorkloadProfile({"all_reduce": 1}))
SIZES = (1024, 1 << 28)  # one size in the 0-1K and 16M-4G buckets
BASELINE = Measurements(tuple(SizeSample("all_reduce", s, 100.0, 1.0) for s in SIZES))
MAX_LOSS = 0.02


def _trial(
    number: int,
    small: float,
    large: float,
    *,
    role: str = "sampled",
    table: str | None = "",
    config: int | None = None,
    stored: bool = True,
) -> FrozenTrial:
    """A completed trial whose one search run measured these speedups at 1 KiB and 256 MiB.

    Its configuration is ``channels = config`` (``number`` when unset): trials of one config are repeats.
    ``table=None``: no table attribute at all (a searched trial); ``stored=False``: no measurements stored.
    """
    measured = Measurements(
        (SizeSample("all_reduce", SIZES[0], 100.0 / small, 1.0), SizeSample("all_reduce", SIZES[1], 100.0 / large, 1.0))
    )
    attrs: dict[str, str] = {A_ROLE: role}
    if stored:
        attrs[A_MEASUREMENTS] = measured.to_json()
    if table is not None:
        attrs[A_TABLE] = table
    trial = optuna.trial.create_trial(
        params={"channels": str(number if config is None else config)},
        distributions={"channels": CategoricalDistribution([str(n) for n in range(100)])},
        value=OBJECTIVE.value(measured, BASELINE),
        user_attrs=attrs,
    )
    trial.number = number
    return trial


def test_a_bucket_within_the_search_slack_looks_safe_and_one_beyond_does_not() -> None:
    edge = 1 - MAX_LOSS - SEARCH_SLACK
    assert looked_safe(_trial(1, edge + 0.001, 1.5), BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS)
    assert not looked_safe(_trial(2, edge - 0.001, 1.5), BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS)
    # The sampler's constraint is the same rule: feasible exactly when the trial looked safe.
    inside = Measurements.from_json(_trial(1, edge + 0.001, 1.5).user_attrs[A_MEASUREMENTS])
    assert shortfall(inside, BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS) <= 0


def test_a_trial_one_noisy_run_put_just_under_max_loss_is_still_proven_before_lower_ones() -> None:
    # Trial 2 is what one noisy 1 KiB run makes of a configuration truly equal there: 0.975, outside maxLoss
    # but within the slack. It must be a finalist ahead of trial 4, which looked safe at a smaller gain.
    trials = [
        _trial(1, 0.90, 2.0),  # the best value, a loss at 1 KiB: the trade-off
        _trial(2, 0.975, 1.4),
        _trial(3, 0.95, 1.5),  # beyond the slack: only by value, after the safe-looking ones
        _trial(4, 1.0, 1.1),
    ]
    chosen = choose_finalists(
        trials, BASELINE, baseline_params={"channels": "0"}, objective=OBJECTIVE, max_loss=MAX_LOSS, count=3
    )
    assert [t.number for t in chosen] == [1, 2, 4]


def test_a_table_that_showed_a_loss_comes_after_every_trial_that_looked_safe() -> None:
    # Trial 5 is a table composed on a base that trades sizes (its 1 KiB loss no row fixed): it must not take
    # the slot of trial 2, which showed no loss.
    trials = [
        _trial(1, 0.90, 2.0),
        _trial(5, 0.90, 1.9, role="per_size", table="# table\n"),
        _trial(2, 1.0, 1.2),
    ]
    chosen = choose_finalists(
        trials, BASELINE, baseline_params={"channels": "0"}, objective=OBJECTIVE, max_loss=MAX_LOSS, count=2
    )
    assert [t.number for t in chosen] == [1, 2]


def test_tables_come_right_after_the_best_and_the_baseline_and_repeats_never() -> None:
    trials = [
        _trial(1, 0.90, 2.0),
        _trial(2, 1.0, 1.2),
        _trial(5, 1.0, 1.05, role="table", table="# table\n"),
        _trial(2, 1.0, 1.2),  # the same configuration measured again
        _trial(0, 1.0, 1.3, role="baseline"),
    ]
    chosen = choose_finalists(
        trials, BASELINE, baseline_params={"channels": "0"}, objective=OBJECTIVE, max_loss=MAX_LOSS, count=5
    )
    assert [t.number for t in chosen] == [1, 5, 2]


# Three configurations the search measured more than once, slower than the defaults overall (never finalists):
# their 1 KiB runs spread, their 256 MiB runs agree. Pooled over the configurations: 4 degrees of freedom.
REPEATS = [
    _trial(n, small, 0.9, config=config)
    for n, (config, small) in enumerate(
        [(7, 1.0), (7, 0.9), (7, 1.1), (8, 0.95), (8, 1.05), (9, 1.0), (9, 1.02)], start=20
    )
]


def test_the_search_noise_is_the_pooled_spread_of_repeated_configurations() -> None:
    noise = search_noise(REPEATS, BASELINE, OBJECTIVE)
    # sqrt of the summed squared deviations of log speedups from each configuration's mean, over 7 - 3 = 4
    assert noise[("all_reduce", "0-1K")] == pytest.approx(0.0796172410, abs=1e-9)
    assert noise[("all_reduce", "16M-4G")] == pytest.approx(0.0, abs=1e-12)
    assert MIN_REPEATS == 4
    assert search_noise(REPEATS[:-1], BASELINE, OBJECTIVE) == {}, "3 degrees of freedom are too few to judge by"
    assert search_noise([REPEATS[0], _trial(30, 0.5, 2.0)], BASELINE, OBJECTIVE) == {}, "no repeat, no estimate"


def test_a_bucket_may_fall_its_measured_noise_below_max_loss_and_still_look_safe() -> None:
    noise = {("all_reduce", "0-1K"): 0.02}
    floor = (1 - MAX_LOSS) * math.exp(-NOISE_Z * 0.02)  # 0.9416, below the fixed 0.97
    assert floor == pytest.approx(0.9415736504, abs=1e-9)
    assert looked_safe(_trial(1, floor + 0.001, 1.5), BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS, noise=noise)
    assert not looked_safe(_trial(1, floor - 0.001, 1.5), BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS, noise=noise)
    assert not looked_safe(_trial(1, floor + 0.001, 1.5), BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS), (
        "without it: the slack"
    )
    # A quiet bucket keeps the fixed slack: the noise only ever widens it.
    quiet = {("all_reduce", "0-1K"): 0.001}
    edge = 1 - MAX_LOSS - SEARCH_SLACK
    assert looked_safe(_trial(1, edge + 0.001, 1.5), BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS, noise=quiet)
    assert not looked_safe(_trial(1, edge - 0.001, 1.5), BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS, noise=quiet)


def test_finalists_judge_looked_safe_by_the_noise_the_search_measured() -> None:
    # Trial 2 fell to 0.93 at 1 KiB in its one run; the repeats show 1 KiB runs spread by 8%: it looked safe
    # and, with the better value, is proven before trial 3.
    trials = [_trial(1, 0.80, 2.0), _trial(2, 0.93, 1.5), _trial(3, 1.0, 1.1)]
    chosen = choose_finalists(
        [*trials, *REPEATS],
        BASELINE,
        baseline_params={"channels": "0"},
        objective=OBJECTIVE,
        max_loss=MAX_LOSS,
        count=2,
    )
    assert [t.number for t in chosen] == [1, 2]
    alone = choose_finalists(
        trials, BASELINE, baseline_params={"channels": "0"}, objective=OBJECTIVE, max_loss=MAX_LOSS, count=2
    )
    assert [t.number for t in alone] == [1, 3], "without repeats, the fixed slack"


def _finalists(trials: list[FrozenTrial], count: int = 5) -> list[int]:
    chosen = choose_finalists(
        trials, BASELINE, baseline_params={"channels": "0"}, objective=OBJECTIVE, max_loss=MAX_LOSS, count=count
    )
    return [t.number for t in chosen]


def test_only_trials_faster_than_the_defaults_are_finalists_and_never_the_defaults_again() -> None:
    faster = _trial(1, 1.0, 1.2)
    level = _trial(2, 1.0, 1.0)  # exactly the defaults' value
    slower = _trial(3, 1.0, 0.9)
    assert level.value == 1.0
    assert _finalists([faster, level, slower]) == [1]
    # The defaults' configuration sampled by the search (no table attribute), measured faster by noise.
    defaults_again = _trial(4, 1.0, 1.5, table=None, config=0)
    assert _finalists([faster, defaults_again]) == [1]
    # The baseline's own trial, whatever its params say.
    assert _finalists([faster, _trial(5, 1.0, 1.5, role="baseline")]) == [1]


def test_a_trial_without_stored_measurements_never_looks_safe_and_is_skipped_by_the_noise() -> None:
    bare = _trial(1, 1.0, 1.5, stored=False)
    assert not looked_safe(bare, BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS)
    assert search_noise([bare, *REPEATS], BASELINE, OBJECTIVE) == search_noise(REPEATS, BASELINE, OBJECTIVE)


def test_the_samplers_constraint_takes_the_measured_noise_and_weighs_only_weighted_buckets() -> None:
    one_run = Measurements.from_json(_trial(1, 0.93, 1.5).user_attrs[A_MEASUREMENTS])
    noise = {("all_reduce", "0-1K"): 0.08}
    assert shortfall(one_run, BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS) == pytest.approx(0.04)
    assert shortfall(one_run, BASELINE, objective=OBJECTIVE, max_loss=MAX_LOSS, noise=noise) < 0
    # A bucket the workload weighs 0 has no say, however slow.
    large_only = Objective(WorkloadProfile({"all_reduce": 1}, {"0-1K": 0.0}))
    assert looked_safe(_trial(2, 0.5, 1.5), BASELINE, objective=large_only, max_loss=MAX_LOSS)
    # A run that measured no weighted bucket (pruned before one): nothing showed a loss.
    small_only = Measurements(one_run.samples[:1])
    assert shortfall(small_only, BASELINE, objective=large_only, max_loss=MAX_LOSS) == pytest.approx(
        -(MAX_LOSS + SEARCH_SLACK)
    )
