"""The study: baseline first, search, pruning, failures, our own heartbeats, kill-and-resume, the proof."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.support.waiting import wait_until
from tests.tuner.landscape import Landscape, exhaustive_optimum, synthetic_space
from topo_tune.config.cluster import SearchConfig
from topo_tune.errors import ConfigError, StudyError, TrialFailed
from topo_tune.sim import defaults_optimal_cluster, demo_cluster
from topo_tune.tuner.objective import Measurements, Objective, WorkloadProfile
from topo_tune.tuner.proof import SMALL_RUNS
from topo_tune.tuner.sim_evaluator import SimEvaluator, sim_space
from topo_tune.tuner.space import SearchSpace, TrialConfig
from topo_tune.tuner.study import (
    SEARCH_SLACK,
    Candidate,
    MeasurementRequest,
    StudyOutcome,
    StudyProgress,
    StudySettings,
    TunerStudy,
    run_study,
)
from topo_tune.tuner.trial_store import A_HEARTBEAT, A_WORKER, C_BUCKET_FLOOR, distributions, from_optuna, to_optuna

ROOT = Path(__file__).resolve().parents[2]
LADDER = (1024, 65536, 1 << 20, 1 << 24, 1 << 28)


def synthetic_objective() -> Objective:
    return Objective(WorkloadProfile({"all_reduce": 2, "all_gather": 1}))


def study_settings(database: str, **overrides: object) -> StudySettings:
    values: dict[str, object] = {
        "name": "study",
        "storage": database,
        "budget": 24,
        "ladder": LADDER,
        "finalists": 2,
        "proof_pairs": 6,
        "heartbeat_interval_s": 0.5,
        "stale_after_s": 30.0,
        "worker_id": "controller-1",
    }
    values.update(overrides)
    return StudySettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def database(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def test_the_baseline_runs_first_then_candidates_and_a_proven_winner_is_chosen(database_url: str) -> None:
    space = synthetic_space()
    landscape = Landscape()
    outcome = run_study(
        study_settings(database_url),
        space=space,
        objective=synthetic_objective(),
        evaluate=landscape,
        candidates=[Candidate("ring-optimizer", space.params_for(rank_order="optimized"))],
    )
    first, second = outcome.trials[0], outcome.trials[1]
    assert first.role == "baseline" and first.value == 1.0 and first.env == dict(space.site_fixed)
    assert second.role == "candidate" and second.rank_order == "optimized"
    assert len(outcome.trials) == 24 and outcome.simulated
    assert outcome.chosen is not None and outcome.chosen.promoted
    assert outcome.chosen.config.rank_order.name == "optimized", "the spine-avoiding order is the big win"
    decisions = {(b.collective, b.bucket.name): b.decision.value for b in outcome.chosen.buckets}
    assert decisions[("all_reduce", "16M-4G")] == "faster"
    pairs = [p.buckets[0].comparison.pairs for p in outcome.proofs]
    assert all(n in (6, 12, 18, 24, 30) for n in pairs), "looks of proof_pairs up to proof_pairs_max"
    assert landscape.calls["proof"] == 2 * SMALL_RUNS * sum(pairs), "every pair: each side once, small sizes 4x"
    for t in outcome.trials:  # site settings reach every trial unchanged
        assert {k: t.env[k] for k in space.site_fixed} == dict(space.site_fixed)


def test_on_a_flat_landscape_the_answer_is_keep_the_defaults(database: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="topo_tune.tuner.study")
    outcome = run_study(
        study_settings(database, budget=16),
        space=synthetic_space(),
        objective=synthetic_objective(),
        evaluate=Landscape(flat=True, noise=0.03),
    )
    assert outcome.chosen is None
    assert all(not p.promoted for p in outcome.proofs)
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("trial ")]
    roles = {m.split("(", 1)[1].split(")", 1)[0] for m in started if "): " in m}
    assert roles == {"baseline", "sampled"}, "each trial's log line names its role"


def test_failed_wrong_and_timed_out_trials_are_recorded_and_never_chosen(database: str) -> None:
    def fail(config: TrialConfig) -> str | None:
        if config.params.get("rank_order") == "optimized":  # the best order: failing it must not hide a "win"
            return "wrong_result"
        if config.params.get("nthreads") == "64":
            return "timeout"
        if config.params.get("channels") == "1":
            return "failed"
        return None

    space = synthetic_space()
    outcome = run_study(
        study_settings(database, budget=30),
        space=space,
        objective=synthetic_objective(),
        evaluate=Landscape(fail=fail),  # type: ignore[arg-type]
        candidates=[Candidate("ring-optimizer", space.params_for(rank_order="optimized"))],
    )
    states = Counter(t.state for t in outcome.trials)
    assert states["wrong_result"] >= 1
    failed = [t for t in outcome.trials if t.state in ("wrong_result", "timeout", "failed")]
    assert all(t.reason and "synthetic" in t.reason for t in failed)
    assert all(t.value is None for t in failed)
    assert outcome.best is None or outcome.best.rank_order != "optimized"
    assert outcome.chosen is None or outcome.chosen.config.rank_order.name != "optimized"


def test_hopeless_trials_are_pruned_along_the_size_ladder(database: str) -> None:
    landscape = Landscape()
    outcome = run_study(
        study_settings(database, budget=30, sampler="random", prune_ratio=0.9, prune_startup=3, finalists=0),
        space=synthetic_space(),
        objective=synthetic_objective(),
        evaluate=landscape,
    )
    pruned = [t for t in outcome.trials if t.state == "pruned"]
    assert pruned, "random sampling on this landscape always meets hopeless configurations"
    assert all(len(t.intermediate) < 3 for t in pruned), "a pruned trial stops before the last rung"
    assert all(t.reason and "partial speedup" in t.reason and "best completed trial" in t.reason for t in pruned)
    assert landscape.calls["search"] < 30 * 3


def test_a_failed_baseline_stops_the_study_with_the_reason(database: str) -> None:
    def evaluate(config: TrialConfig, request: MeasurementRequest) -> Measurements:
        raise TrialFailed("NCCL init failed on node-2", kind="failed")

    with pytest.raises(StudyError, match="node-2"):
        run_study(study_settings(database), space=synthetic_space(), objective=synthetic_objective(), evaluate=evaluate)


def test_a_stored_study_refuses_a_different_search_space(database: str) -> None:
    run_study(
        study_settings(database, budget=3, finalists=0),
        space=synthetic_space(),
        objective=synthetic_objective(),
        evaluate=Landscape(),
    )
    with pytest.raises(StudyError, match="different space"):
        run_study(
            study_settings(database, budget=3, finalists=0),
            space=synthetic_space(nccl_version="2.24.3"),
            objective=synthetic_objective(),
            evaluate=Landscape(),
        )


def _orphan(database: str, *, worker: str, heartbeat: float) -> int:
    """A trial another worker asked for and then went silent on."""
    space = synthetic_space()
    runner = TunerStudy(study_settings(database), space=space, objective=synthetic_objective(), evaluate=Landscape())
    try:
        trial = runner.open().ask(distributions(space))
        trial.set_user_attr(A_WORKER, worker)
        trial.set_user_attr(A_HEARTBEAT, heartbeat)
        return int(trial.number)
    finally:
        runner.close()


def test_another_workers_trial_is_waited_for_then_failed_as_stale_and_retried_once(database_url: str) -> None:
    now = [1000.0]
    orphan = _orphan(database_url, worker="controller-0", heartbeat=now[0])

    def sleep(seconds: float) -> None:
        now[0] += seconds

    outcome = run_study(
        study_settings(database_url, budget=8, finalists=0, stale_after_s=30.0, poll_interval_s=5.0),
        space=synthetic_space(),
        objective=synthetic_objective(),
        evaluate=Landscape(),
        clock=lambda: now[0],
        sleep=sleep,
    )
    stale = next(t for t in outcome.trials if t.number == orphan)
    assert stale.state == "stale" and stale.superseded and "no heartbeat" in (stale.reason or "")
    retry = [t for t in outcome.trials if t.attempt == 2]
    assert len(retry) == 1 and retry[0].params == stale.params and retry[0].state == "complete"
    assert len([t for t in outcome.trials if not t.superseded]) == 8
    assert now[0] > 1030.0, "it waited for the heartbeat to lapse instead of stealing a live trial"


def test_a_trial_whose_worker_died_before_labelling_it_is_reclaimed_without_waiting_for_staleness(
    database_url: str,
) -> None:
    space = synthetic_space()
    settings = study_settings(database_url)
    runner = TunerStudy(settings, space=space, objective=synthetic_objective(), evaluate=Landscape())
    try:
        unlabeled = int(runner.open().ask(distributions(space)).number)  # killed right here: no label, no heartbeat
    finally:
        runner.close()
    outcome, waited = _resume_on_a_fake_clock(database_url, space, budget=6)
    orphan = next(t for t in outcome.trials if t.number == unlabeled)
    assert orphan.state == "stale" and "before labelling" in (orphan.reason or "")
    assert len([t for t in outcome.trials if not t.superseded]) == 6
    assert waited < 60, "it did not wait stale_after_s (1200 s) for a trial nobody owns"


def _resume_on_a_fake_clock(database_url: str, space: SearchSpace, *, budget: int) -> tuple[StudyOutcome, float]:
    """Run the study to its end on a clock that moves only when it sleeps; the outcome and the seconds slept."""
    start = time.time()
    now = [start]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    outcome = run_study(
        study_settings(database_url, budget=budget, finalists=0, stale_after_s=1200.0, poll_interval_s=5.0),
        space=space,
        objective=synthetic_objective(),
        evaluate=Landscape(),
        clock=lambda: now[0],
        sleep=sleep,
    )
    return outcome, now[0] - start


@pytest.mark.parametrize("role", ["baseline", "sampled"])
def test_a_trial_killed_inside_ask_with_some_params_stored_is_retried_whole(database_url: str, role: str) -> None:
    # Optuna stores a trial's params one at a time while ask() suggests them: a kill in between leaves a subset.
    space = synthetic_space()
    dists = distributions(space)
    first = space.names[0]
    runner = TunerStudy(
        study_settings(database_url), space=space, objective=synthetic_objective(), evaluate=Landscape()
    )
    try:
        study = runner.open()
        if role == "baseline":
            study.enqueue_trial(
                to_optuna(space, space.baseline_params()), user_attrs={"role": "baseline", "attempt": 1}
            )
        else:
            run_study(
                study_settings(database_url, budget=2, finalists=0),
                space=space,
                objective=synthetic_objective(),
                evaluate=Landscape(),
            )
        trial = study.ask()
        trial._suggest(first, dists[first])  # the kill comes before the second param is stored
        orphan = int(trial.number)
    finally:
        runner.close()
    outcome, _ = _resume_on_a_fake_clock(database_url, space, budget=5)
    killed = next(t for t in outcome.trials if t.number == orphan)
    assert killed.state == "stale" and killed.superseded
    assert list(killed.params) == [first] and killed.env == {}
    retry = next(t for t in outcome.trials if t.attempt == 2)
    assert retry.state == "complete" and set(retry.params) == set(space.names)
    assert retry.role == role
    if role == "baseline":
        assert retry.params == space.baseline_params()
    assert len([t for t in outcome.trials if not t.superseded]) == 5


def test_a_fresh_heartbeat_of_another_worker_is_left_alone(database: str) -> None:
    orphan = _orphan(database, worker="controller-0", heartbeat=1000.0)
    study = TunerStudy(
        study_settings(database),
        space=synthetic_space(),
        objective=synthetic_objective(),
        evaluate=Landscape(),
        clock=lambda: 1010.0,
    )
    try:
        opened = study.open()
        study._reclaim_stale(opened)
        assert opened.trials[orphan].state == optuna.trial.TrialState.RUNNING
    finally:
        study.close()


def test_a_study_killed_mid_trial_resumes_with_every_trial_counted_once(database_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "hung-in-trial"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.tuner.study_worker", database_url, str(marker), "14"], cwd=ROOT, env=env
    )
    try:
        hung = int(wait_until(lambda: marker.exists() and marker.read_text(), timeout=60, what="the child to hang"))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    landscape = Landscape()
    outcome = run_study(
        study_settings(database_url), space=synthetic_space(), objective=synthetic_objective(), evaluate=landscape
    )
    counted = [t for t in outcome.trials if not t.superseded]
    assert len(counted) == 24, "no lost and no extra trial"
    assert not [t for t in outcome.trials if t.state in ("running", "waiting")]
    killed = next(t for t in outcome.trials if t.number == hung)
    assert killed.state == "stale" and "restarted" in (killed.reason or "")
    retries = [t for t in outcome.trials if t.attempt == 2]
    assert [t.params for t in retries] == [killed.params]
    assert len([t for t in outcome.trials if t.role == "baseline"]) == 1
    assert outcome.chosen is not None


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes", "coordinate"])
def test_every_sampler_runs_a_study_reproducibly(database: str, tmp_path: Path, sampler: str) -> None:
    def run(url: str) -> list[dict[str, str]]:
        outcome = run_study(
            study_settings(url, budget=14, sampler=sampler, finalists=0),
            space=synthetic_space(),
            objective=synthetic_objective(),
            evaluate=Landscape(),
        )
        return [dict(t.params) for t in outcome.trials]

    assert run(database) == run(f"sqlite:///{tmp_path / 'again.db'}"), "seeded: the same trials again"


def test_tpe_builds_on_the_baseline_and_candidates_instead_of_ten_random_trials(tmp_path: Path) -> None:
    # Right after the baseline and a candidate on the good (optimized) order, TPE proposes from its model, so
    # its proposals stay mostly on that order. Optuna's default start-up (10 random trials) would put only a
    # third of them there, like random search: 5 of these 12 with the same seeds.
    space = synthetic_space()
    on_the_good_order = 0
    for seed in (0, 1):
        outcome = run_study(
            study_settings(f"sqlite:///{tmp_path / f'{seed}.db'}", budget=8, seed=seed, finalists=0),
            space=space,
            objective=synthetic_objective(),
            evaluate=Landscape(seed=seed),
            candidates=[Candidate("ring", space.params_for(rank_order="optimized"))],
        )
        sampled = [t for t in outcome.trials if t.role == "sampled"]
        assert len(sampled) == 6
        on_the_good_order += sum(t.rank_order == "optimized" for t in sampled)
    assert on_the_good_order >= 9, on_the_good_order


def test_coordinate_descent_moves_one_dimension_at_a_time_from_the_incumbent(database: str) -> None:
    space = synthetic_space()
    run_study(
        study_settings(database, budget=20, sampler="coordinate", finalists=0),
        space=space,
        objective=synthetic_objective(),
        evaluate=Landscape(),
    )
    study = optuna.load_study(study_name="study", storage=database)
    trials = study.trials
    for t in trials[1:]:
        earlier = [p for p in trials[: t.number] if p.state == optuna.trial.TrialState.COMPLETE]
        incumbent = max(earlier, key=lambda p: p.value)
        changed = [n for n in space.names if t.params[n] != incumbent.params[n]]
        assert len(changed) == 1, f"trial {t.number} changed {changed}"


def test_on_the_sim_demo_cluster_tpe_finds_the_exhaustive_optimum(database: str) -> None:
    cluster = demo_cluster()
    names = cluster.node_names
    grouped = [n for n in names if cluster.node(n).rack == "rack-a"] + [
        n for n in names if cluster.node(n).rack == "rack-b"
    ]
    space = sim_space(
        cluster,
        nccl_version="2.28.3",
        collectives=["all_reduce"],
        optimized=grouped,
        knobs=["channels", "ib_qps", "nthreads"],
    )
    objective = Objective(WorkloadProfile({"all_reduce": 1}))
    quiet = SimEvaluator(cluster, noise=False)
    request = MeasurementRequest(objective.collectives, LADDER, 0, "search")
    baseline = quiet(space.config(space.baseline_params()), request)
    best = max(
        objective.value(quiet(space.config(dict(zip(space.names, v, strict=True))), request), baseline)
        for v in itertools.product(*(space.values_of(n) for n in space.names))
    )
    # Three finalists: the best search values trade a loss in the tree-sized all_reduce buckets (here up to
    # 7% at 1-16 MiB) for a large gain at >= 16 MiB. What ships must be no worse than maxLoss in any bucket,
    # noise-free; the best trade-off is named instead of shipped.
    outcome = run_study(
        study_settings(database, budget=40, finalists=3),
        space=space,
        objective=objective,
        evaluate=SimEvaluator(cluster),
    )
    assert outcome.best is not None
    found = objective.value(quiet(space.config(outcome.best.params), request), baseline)
    assert found >= best / 1.02
    assert outcome.simulated
    if outcome.chosen is not None:
        truth = objective.bucket_scores(quiet(outcome.chosen.config, request), baseline)
        assert min(b.speedup for b in truth) >= 0.98, "the promoted config is safe in every bucket, noise-free"
    assert outcome.tradeoff is not None, "the better, unsafe configuration is named as the trade-off"
    traded = objective.value(quiet(outcome.tradeoff.proof.config, request), baseline)
    assert traded >= best / 1.02, "the trade-off is within 2% of the exhaustive optimum"
    truth = objective.bucket_scores(quiet(outcome.tradeoff.proof.config, request), baseline)
    unsafe = {(b.collective, b.bucket.name) for b in truth if b.speedup < 0.98}
    assert unsafe <= {(b.collective, b.bucket.name) for b in outcome.tradeoff.unsafe}, "its true losses are named"


def test_on_the_sim_cluster_where_defaults_are_optimal_nothing_is_promoted(database: str) -> None:
    cluster = defaults_optimal_cluster()
    space = sim_space(cluster, nccl_version="2.28.3", collectives=["all_reduce", "all_gather"])
    outcome = run_study(
        study_settings(database, budget=20),
        space=space,
        objective=Objective(WorkloadProfile({"all_reduce": 1, "all_gather": 1})),
        evaluate=SimEvaluator(cluster),
    )
    assert outcome.chosen is None, [(p.trial, p.speedup) for p in outcome.proofs]


def test_the_synthetic_landscape_rewards_tuning_and_params_map_both_ways() -> None:
    space = synthetic_space(knobs=["channels", "ib_qps"])
    assert exhaustive_optimum(space, synthetic_objective(), Landscape(), LADDER) > 1.1
    baseline = space.baseline_params()
    assert from_optuna(space, to_optuna(space, baseline)) == baseline
    assert to_optuna(space, baseline)["channels"] == space.values_of("channels").index("default") > 0


class _Crash(Exception):
    """Stands for the controller dying mid-proof."""


def test_a_proof_interrupted_midway_continues_where_it_stopped(database: str) -> None:
    settings = study_settings(database, budget=12, finalists=1, proof_pairs=6)
    landscape = Landscape()

    def crashing(config: TrialConfig, request: MeasurementRequest) -> Measurements:
        if request.purpose == "proof" and request.repeat == 3 and request.side == "candidate":
            raise _Crash
        return landscape(config, request)

    with pytest.raises(_Crash):
        run_study(settings, space=synthetic_space(), objective=synthetic_objective(), evaluate=crashing)
    per_pair = 2 * SMALL_RUNS  # each side's full ladder, then its extra runs of the small sizes
    assert landscape.calls["proof"] == 3 * per_pair + 1, "three pairs stored, the fourth's baseline side measured"
    resumed = Landscape()
    progress: list[StudyProgress] = []
    outcome = run_study(
        settings,
        space=synthetic_space(),
        objective=synthetic_objective(),
        evaluate=resumed,
        on_progress=progress.append,
    )
    assert resumed.calls == {"search": 0, "proof": 3 * per_pair}, "no trial and no stored pair is measured again"
    assert outcome.proofs[0].buckets[0].comparison.pairs == 6
    assert progress[-1].phase == "done" and progress[-1].done == 12 and progress[-1].best_value is not None
    assert [p.done for p in progress if p.phase == "proof"] == [4, 5, 6]


def test_a_benchmark_that_skips_a_size_fails_its_trial_and_extra_sizes_are_ignored(database: str) -> None:
    landscape = Landscape()

    def sloppy(config: TrialConfig, request: MeasurementRequest) -> Measurements:
        wider = MeasurementRequest(request.collectives, (*request.sizes, 3), request.trial, request.purpose)
        got = landscape(config, wider)  # one size too many: ignored
        if config.params.get("nthreads") == "64" and request.purpose == "search":
            return Measurements(got.samples[1:], simulated=True)  # one size missing: the trial fails
        return got

    outcome = run_study(
        study_settings(database, budget=16, finalists=1),
        space=synthetic_space(),
        objective=synthetic_objective(),
        evaluate=sloppy,
    )
    skipped = [t for t in outcome.trials if t.params.get("nthreads") == "64"]
    assert skipped and all(t.state == "failed" and "no result" in (t.reason or "") for t in skipped)
    assert all(3 not in {s.bytes for s in t.measurements.samples} for t in outcome.trials if t.measurements)


def test_sizes_in_buckets_weighted_zero_neither_crash_the_search_nor_pass_for_a_workload(database: str) -> None:
    # A workload that ignores small messages: the first rung of the ladder holds only zero-weight buckets.
    large_only = Objective(WorkloadProfile({"all_reduce": 2, "all_gather": 1}, {"0-1K": 0, "1K-64K": 0}))
    outcome = run_study(
        study_settings(database, budget=6, finalists=1, proof_pairs=2),
        space=synthetic_space(),
        objective=large_only,
        evaluate=Landscape(),
    )
    assert [t.state for t in outcome.trials if t.state not in ("complete", "pruned")] == []
    assert outcome.best is not None and outcome.best.value is not None
    nothing_weighted = Objective(WorkloadProfile({"all_reduce": 1}, {"0-1K": 0, "1K-64K": 0}))
    with pytest.raises(ConfigError, match=r"workload\.buckets.*4096 bytes.*hold 65537-1048576, 1048577-"):
        TunerStudy(
            study_settings(database, name="small-only", ladder=(256, 1024, 4096)),
            space=synthetic_space(),
            objective=nothing_weighted,
            evaluate=Landscape(),
        )


def test_a_stored_study_refuses_other_sizes_or_collectives_instead_of_mixing_measurements(database: str) -> None:
    settings = study_settings(database, budget=8, finalists=1, proof_pairs=2)
    first = run_study(settings, space=synthetic_space(), objective=synthetic_objective(), evaluate=Landscape())
    assert first.proofs, "a finalist was proven over the first ladder"
    other_ladder = dataclasses.replace(settings, ladder=tuple(s * 2 for s in LADDER))
    with pytest.raises(StudyError, match=r"sizes"):
        run_study(other_ladder, space=synthetic_space(), objective=synthetic_objective(), evaluate=Landscape())
    other_workload = Objective(WorkloadProfile({"all_reduce": 1}))
    with pytest.raises(StudyError, match=r"all_gather"):
        run_study(settings, space=synthetic_space(), objective=other_workload, evaluate=Landscape())
    again = run_study(settings, space=synthetic_space(), objective=synthetic_objective(), evaluate=Landscape())
    assert [t.number for t in again.trials] == [t.number for t in first.trials], "the same settings resume"


def test_a_baseline_killed_on_every_attempt_is_measured_again_when_the_study_is_resumed(database: str) -> None:
    settings = study_settings(database, budget=3, finalists=0)

    def killed(config: TrialConfig, request: MeasurementRequest) -> Measurements:
        raise _Crash  # Ctrl-C (or SIGKILL) while the baseline is measured

    for _ in range(3):
        with pytest.raises(_Crash):
            run_study(settings, space=synthetic_space(), objective=synthetic_objective(), evaluate=killed)
    outcome = run_study(settings, space=synthetic_space(), objective=synthetic_objective(), evaluate=Landscape())
    baselines = [t for t in outcome.trials if t.role == "baseline"]
    assert [t.state for t in baselines] == ["stale", "stale", "stale", "complete"]
    assert [t.superseded for t in baselines] == [True, True, True, False]
    assert len([t for t in outcome.trials if not t.superseded]) == 3, "the killed attempts count for nothing"


def test_study_settings_take_search_defaults_and_checks_from_cluster_yaml(database: str) -> None:
    settings, search = StudySettings(name="s", storage=database), SearchConfig()
    shared = ("budget", "sampler", "rungs", "finalists", "proof_pairs", "proof_pairs_max", "min_effect", "max_loss")
    assert [getattr(settings, name) for name in shared] == [getattr(search, name) for name in shared]
    with pytest.raises(ConfigError, match=r"^study\.budget: input should be greater than or equal to 1$"):
        StudySettings(name="s", storage=database, budget=0)
    with pytest.raises(ConfigError, match=r"^study\.sampler: input should be 'tpe', 'random', 'cmaes' or 'coordinate'"):
        StudySettings(name="s", storage=database, sampler="grid")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^study\.proof_pairs_max: must be at least proof_pairs \(10\), got 4$"):
        StudySettings(name="s", storage=database, proof_pairs_max=4)


def test_each_trial_tells_tpe_how_far_its_worst_weighted_bucket_fell_below_the_floor(database: str) -> None:
    objective = synthetic_objective()
    run_study(
        study_settings(database, budget=10, finalists=0),
        space=synthetic_space(),
        objective=objective,
        evaluate=Landscape(),
    )
    trials = optuna.load_study(study_name="study", storage=database).get_trials(states=(TrialState.COMPLETE,))
    baseline = Measurements.from_json(trials[0].user_attrs["measurements"])
    shortfalls = []
    for t in trials[1:]:
        scores = objective.bucket_scores(Measurements.from_json(t.user_attrs["measurements"]), baseline)
        worst = min(s.speedup for s in scores)
        shortfalls.append(t.system_attrs[f"constraints:{C_BUCKET_FLOOR}"])
        assert shortfalls[-1] == pytest.approx(1 - 0.02 - SEARCH_SLACK - worst), t.number
    assert f"constraints:{C_BUCKET_FLOOR}" not in trials[0].system_attrs, "the baseline is the reference"
    assert any(s > 0 for s in shortfalls), "a trial measured below the floor somewhere is infeasible"
