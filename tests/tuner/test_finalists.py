"""Which searched trials the proof re-measures: the best, the tables, those that looked safe, the rest."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial

from topo_tune.tuner.finalists import SEARCH_SLACK, choose_finalists, looked_safe, shortfall
from topo_tune.tuner.objective import Measurements, Objective, SizeSample, WorkloadProfile
from topo_tune.tuner.trial_store import A_MEASUREMENTS, A_ROLE, A_TABLE

OBJECTIVE = Objective(WorkloadProfile({"all_reduce": 1}))
SIZES = (1024, 1 << 28)  # one size in the 0-1K and 16M-4G buckets
BASELINE = Measurements(tuple(SizeSample("all_reduce", s, 100.0, 1.0) for s in SIZES))
MAX_LOSS = 0.02


def _trial(number: int, small: float, large: float, *, role: str = "sampled", table: str = "") -> FrozenTrial:
    """A completed trial whose one search run measured these speedups at 1 KiB and 256 MiB."""
    measured = Measurements(
        (SizeSample("all_reduce", SIZES[0], 100.0 / small, 1.0), SizeSample("all_reduce", SIZES[1], 100.0 / large, 1.0))
    )
    trial = optuna.trial.create_trial(
        params={"channels": str(number)},
        distributions={"channels": CategoricalDistribution([str(n) for n in range(100)])},
        value=OBJECTIVE.value(measured, BASELINE),
        user_attrs={A_MEASUREMENTS: measured.to_json(), A_ROLE: role, A_TABLE: table},
    )
    trial.number = number
    return trial


def test_a_bucket_within_the_search_slack_looks_safe_and_one_beyond_does_not() -> None:
    edge = 1 - MAX_LOSS - SEARCH_SLACK
    assert looked_safe(_trial(1, edge + 0.001, 1.5), BASELINE, OBJECTIVE, MAX_LOSS)
    assert not looked_safe(_trial(2, edge - 0.001, 1.5), BASELINE, OBJECTIVE, MAX_LOSS)
    # The sampler's constraint is the same rule: feasible exactly when the trial looked safe.
    inside = Measurements.from_json(_trial(1, edge + 0.001, 1.5).user_attrs[A_MEASUREMENTS])
    assert shortfall(inside, BASELINE, OBJECTIVE, MAX_LOSS) <= 0


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
