"""A study composes a tuner-plugin table from its per-bucket winners, measures it, and ships what it proved."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tuner.test_study import study_settings
from topo_tune.plugin import parse_tuner_table
from topo_tune.sim import demo_cluster, simulate
from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.objective import Measurements, Objective, SizeSample, WorkloadProfile
from topo_tune.tuner.outputs import ClusterShape, write_outputs
from topo_tune.tuner.plugin_table import TABLE_HEADER, ScoredTrial, compose_table, forced_channels
from topo_tune.tuner.sim_evaluator import SimEvaluator, sim_space
from topo_tune.tuner.statistics import Decision
from topo_tune.tuner.study import Candidate, StudyProgress, run_study

OBJECTIVE = Objective(WorkloadProfile({"all_reduce": 1}))
SIZES = (4096, 1 << 20, 256 << 20)  # one size in the 1K-64K, 64K-1M and 16M-4G buckets


def _measured(times: tuple[float, float, float]) -> Measurements:
    return Measurements(tuple(SizeSample("all_reduce", s, t, s / t / 1e3) for s, t in zip(SIZES, times, strict=True)))


def _trial(number: int, channels: int | None, times: tuple[float, float, float], value: float) -> ScoredTrial:
    env = {} if channels is None else {"NCCL_MIN_CTAS": str(channels), "NCCL_MAX_CTAS": str(channels)}
    return ScoredTrial(number, {"NCCL_NTHREADS": "256", **env}, value, _measured(times))


BASELINE = _measured((20.0, 30.0, 1000.0))


def test_each_bucket_gets_its_winners_channels_under_the_largest_count() -> None:
    trials = [
        _trial(1, 16, (14.0, 31.0, 1200.0), 1.05),  # wins small messages
        _trial(2, 32, (21.0, 26.0, 900.0), 1.12),  # the best overall; wins the largest
        _trial(3, 64, (22.0, 25.0, 950.0), 1.08),  # wins 64K-1M
    ]
    composed = compose_table(trials, BASELINE, OBJECTIVE, nodes=1, ranks=2)

    assert composed is not None
    assert composed.base_trial == 2
    assert composed.env == {"NCCL_NTHREADS": "256", "NCCL_MIN_CTAS": "64", "NCCL_MAX_CTAS": "64"}
    rows = parse_tuner_table(composed.text)
    assert [(r.min_bytes, r.max_bytes, r.channels) for r in rows] == [
        (0, 1024, 32),  # no trial measured it: the best trial's count
        (1025, 65536, 16),
        (1048577, 16777216, 32),  # 64K-1M wants 64, the communicator's count: no row
        (16777217, 4294967295, 32),
    ]
    assert all(r.algorithm is None and r.protocol is None and (r.n_nodes, r.n_ranks) == (1, 2) for r in rows)


def test_a_bucket_the_workload_does_not_weigh_keeps_the_best_trials_count() -> None:
    trials = [_trial(1, 16, (14.0, 31.0, 1200.0), 1.05), _trial(2, 32, (21.0, 26.0, 900.0), 1.12)]
    unweighted_small = Objective(WorkloadProfile({"all_reduce": 1}, {"1K-64K": 0.0}))
    assert compose_table(trials, BASELINE, unweighted_small, nodes=1, ranks=2) is None


def test_no_table_when_every_bucket_wants_the_same() -> None:
    trials = [_trial(1, 16, (14.0, 25.0, 900.0), 1.2), _trial(2, None, (15.0, 26.0, 950.0), 1.1)]
    assert compose_table(trials, BASELINE, OBJECTIVE, nodes=1, ranks=2) is None
    # A winner that left channels to NCCL asks for nothing either.
    assert compose_table([_trial(1, None, (14.0, 25.0, 900.0), 1.2)], BASELINE, OBJECTIVE, nodes=1, ranks=2) is None


def test_a_count_is_forced_only_by_equal_numeric_min_and_max_ctas() -> None:
    assert forced_channels({"NCCL_MIN_CTAS": "8", "NCCL_MAX_CTAS": "8"}) == 8
    assert forced_channels({"NCCL_MIN_CTAS": "8", "NCCL_MAX_CTAS": "16"}) is None, "a range forces nothing"
    assert forced_channels({"NCCL_MIN_CTAS": "8"}) is None
    assert forced_channels({"NCCL_MIN_CTAS": "eight", "NCCL_MAX_CTAS": "eight"}) is None


def test_each_row_records_its_winner_and_speedup_for_the_log_and_the_table_has_its_header() -> None:
    trials = [
        _trial(1, 16, (14.0, 31.0, 1200.0), 1.05),
        _trial(2, 32, (21.0, 26.0, 900.0), 1.12),
        _trial(3, 64, (22.0, 25.0, 950.0), 1.08),
    ]
    composed = compose_table(trials, BASELINE, OBJECTIVE, nodes=1, ranks=2)
    assert composed is not None and composed.text.startswith(f"# {TABLE_HEADER}\n")
    assert [(r.bucket.name, r.channels, r.winner, round(r.speedup, 4)) for r in composed.rows] == [
        ("0-1K", 32, 2, 1.0),  # measured by no trial: the best trial's count, no gain claimed
        ("1K-64K", 16, 1, round(20.0 / 14.0, 4)),
        ("1M-16M", 32, 2, 1.0),
        ("16M-4G", 32, 2, round(1000.0 / 900.0, 4)),  # 64K-1M wants 64, the communicator's count: no row
    ]


def test_under_nccls_own_count_rows_ask_for_a_count_and_the_environment_stays_unforced() -> None:
    # The best trial leaves channels to NCCL: its count stays the communicator's, a row only asks for 16.
    trials = [_trial(1, 16, (14.0, 31.0, 1200.0), 1.05), _trial(2, None, (21.0, 26.0, 900.0), 1.12)]
    composed = compose_table(trials, BASELINE, OBJECTIVE, nodes=1, ranks=2)
    assert composed is not None and composed.env == {"NCCL_NTHREADS": "256"}
    assert [(r.min_bytes, r.channels) for r in parse_tuner_table(composed.text)] == [(1025, 16)]


def test_ties_go_to_the_earlier_trial_and_a_bucket_won_at_no_gain_keeps_the_best_trials_count() -> None:
    # Equal values: the earlier trial is the base.
    trials = [_trial(1, 32, (21.0, 26.0, 900.0), 1.12), _trial(2, 48, (14.0, 27.0, 950.0), 1.12)]
    composed = compose_table(trials, BASELINE, OBJECTIVE, nodes=1, ranks=2)
    assert composed is not None and composed.base_trial == 1
    tied = [_trial(1, 32, (21.0, 26.0, 900.0), 1.12), _trial(2, 16, (14.0, 30.0, 1100.0), 1.0)]
    tied.append(_trial(3, 8, (14.0, 30.0, 1100.0), 0.9))  # the same 1K-64K time as trial 2, later: 2 wins it
    composed = compose_table(tied, BASELINE, OBJECTIVE, nodes=1, ranks=2)
    assert composed is not None and [(r.bucket.name, r.channels) for r in composed.rows] == [("1K-64K", 16)]
    # 64K-1M at exactly the defaults' time: a winner with no gain gets no row of its own.
    level = [_trial(1, 32, (21.0, 31.0, 900.0), 1.12), _trial(2, 16, (25.0, 30.0, 1100.0), 1.0)]
    assert compose_table(level, BASELINE, OBJECTIVE, nodes=1, ranks=2) is None


@pytest.mark.slow
def test_a_sim_study_measures_the_composed_table_and_ships_it_only_when_shown_safe(tmp_path: Path) -> None:
    # On the demo cluster's model 16 channels (in the environment) win large all_reduces 2x and lose to 64 in 1M-16M.
    cluster = demo_cluster()
    space = sim_space(cluster, nccl_version="2.28.3", collectives=["all_reduce"], knobs=["channels"])
    ladder = (4096, 1 << 20, 4 << 20, 64 << 20, 1 << 30)
    ranks = 8 * len(cluster.node_names)
    progress: list[StudyProgress] = []
    outcome = run_study(
        study_settings(
            f"sqlite:///{tmp_path / 'study.db'}",
            budget=4,
            ladder=ladder,
            table_shape=(len(cluster.node_names), ranks),
            finalists=8,
        ),
        space=space,
        objective=OBJECTIVE,
        evaluate=SimEvaluator(cluster),
        candidates=[
            Candidate(f"ch{c}", space.params_for(env={"NCCL_MIN_CTAS": c, "NCCL_MAX_CTAS": c}))
            for c in ("16", "64", "8")
        ],
        on_progress=progress.append,
    )
    searched = [(p.done, p.total) for p in progress if p.phase == "search"]
    assert (5, 5) in searched, "4 searched trials (the candidates fill the budget), then the table trial adds itself"
    assert searched[-1][0] == searched[-1][1], "and so does each trial of the per-size search after it"
    assert all(done <= total for done, total in searched), "progress never shows more done than the total"

    [table_trial] = [t for t in outcome.trials if t.role == "table"]
    assert table_trial.state == "complete"
    assert table_trial.env["NCCL_MIN_CTAS"] == table_trial.env["NCCL_MAX_CTAS"] == "64"
    rows = {(r.min_bytes, r.channels) for r in parse_tuner_table(table_trial.tuner_table)}
    assert (16777217, 16) in rows, "the largest bucket runs 16 channels under a 64-channel communicator"
    # Measured as the plugin applies it: NCCL picks its algorithm/protocol first (under the communicator's 64
    # channels) and only then takes the row's count, so 1 GiB runs 64 channels' pick on 16 channels; forcing 16
    # in the environment would have moved the pick itself (to NVLS tree, 2x faster). 4 MiB: no row, 64 channels.
    measured = table_trial.measurements
    assert measured is not None

    def model(env: dict[str, str], size: int) -> tuple[float, str, str]:
        (s,) = simulate(
            cluster, collective="all_reduce", sizes=[size], env=env, rank_order=cluster.node_names, seed=0
        ).sizes
        return s.model_time_us, s.algorithm, s.protocol

    ch64 = {"NCCL_MIN_CTAS": "64", "NCCL_MAX_CTAS": "64"}
    ch16 = {"NCCL_MIN_CTAS": "16", "NCCL_MAX_CTAS": "16"}
    _, algorithm, protocol = model(ch64, 1 << 30)
    got = {s.bytes: s.time_us for s in measured.samples}
    assert got[1 << 30] == pytest.approx(
        model({**ch16, "NCCL_ALGO": algorithm, "NCCL_PROTO": protocol}, 1 << 30)[0], rel=0.15
    )
    assert got[4 << 20] == pytest.approx(model(ch64, 4 << 20)[0], rel=0.15)
    assert model(ch16, 1 << 30)[1:] != (algorithm, protocol), (
        "the environment's count moves NCCL's pick; a row's does not"
    )

    # The channel table runs 16 channels at 1 GiB under a 64-channel communicator, which loses there: shown slower
    # in a weighted bucket, it is not shipped (a table ships only when every weighted bucket is shown safe). Every
    # trial is a finalist here: a table whose search run showed that loss is otherwise proven after the others.
    [tabled] = [p for p in outcome.proofs if p.trial == table_trial.number]
    assert any(b.decision is Decision.SLOWER for b in tabled.weighted)
    assert not tabled.promoted
    chosen = outcome.chosen
    assert chosen is None or chosen.trial != table_trial.number
    # What ships, if anything, was shown safe in every weighted bucket, and a table ships exactly as proven: here
    # the per-size search's table on the 64-channel base (tree/LL128 above 16 MiB, where 64 channels' own pick
    # loses to 16 channels) is.
    assert chosen is not None and all(b.decision.safe for b in chosen.weighted)
    assert any(r.algorithm == "tree" for r in parse_tuner_table(chosen.config.tuner_table or ""))
    written = write_outputs(
        outcome,
        tmp_path / "out",
        shape=ClusterShape(
            {n: 8 for n in cluster.node_names},
            PairMatrix.from_matrices(
                cluster.node_names,
                tuple(tuple(0.0 if a == b else 50.0 for b in cluster.node_names) for a in cluster.node_names),
                method="test",
            ),
        ),
        nccl_version="2.28.3",
        topology_fingerprint="tf-test",
        advice=None,
    )
    assert (written.directory / "nccl_tuner.conf").read_text() == chosen.config.tuner_table, "no unproven row ships"


def test_option_trials_measure_the_whole_ladder_even_when_far_behind(tmp_path: Path) -> None:
    # Forcing one entry everywhere it is offered is meant to lose in some buckets (tree/simple at 4 KiB): a
    # pruner judging the whole-ladder value would stop such a trial at its small sizes, before the bucket
    # where it wins was measured. Every option trial measures every size.
    cluster = demo_cluster()
    space = sim_space(cluster, nccl_version="2.28.3", collectives=["all_reduce"], knobs=["channels"])
    ladder = (4096, 1 << 20, 4 << 20, 64 << 20, 1 << 30)
    outcome = run_study(
        study_settings(
            f"sqlite:///{tmp_path / 'study.db'}",
            budget=6,
            ladder=ladder,
            rungs=3,
            prune_ratio=0.9,
            prune_startup=1,
            table_shape=(len(cluster.node_names), 8 * len(cluster.node_names)),
            finalists=0,
        ),
        space=space,
        objective=OBJECTIVE,
        evaluate=SimEvaluator(cluster),
        candidates=[Candidate("ch16", space.params_for(env={"NCCL_MIN_CTAS": "16", "NCCL_MAX_CTAS": "16"}))],
    )
    options = [t for t in outcome.trials if t.role == "option"]
    assert options
    assert all(t.state == "complete" and t.measurements is not None for t in options)
    assert all({s.bytes for s in t.measurements.samples} == set(ladder) for t in options if t.measurements)
    best = max(t.value for t in outcome.trials if t.value is not None and t.role != "option")
    assert any(t.value is not None and t.value < 0.9 * best for t in options), "one would have been pruned"
