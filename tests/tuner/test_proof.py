"""The proof's schedule and choice: looks until decided, a loss stops a finalist, weight-0 buckets do not
count, a resumed proof measures nothing twice, the trade-off says what would accept it."""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from topo_tune.errors import ConfigError, TrialFailed
from topo_tune.tuner.evaluation import MeasurementRequest
from topo_tune.tuner.objective import DEFAULT_BUCKETS, Measurements, Objective, SizeSample, WorkloadProfile
from topo_tune.tuner.proof import BucketProof, FinalistProof, ProofSettings, Prover, tradeoff
from topo_tune.tuner.space import RankOrder, TrialConfig
from topo_tune.tuner.statistics import Bounds, Decision, compare

SIZES = (1024, 65536, 1 << 20, 1 << 24, 1 << 28)  # one per default bucket
TWO_LARGE = (1 << 28, 1 << 30)  # two sizes in one bucket
ORDER = RankOrder("natural", ("a", "b"))
BASELINE = TrialConfig(env={}, rank_order=ORDER)


@dataclass
class Model:
    """True speedup per (finalist name, bucket); log-normal noise per pair and side, seeded."""

    speedups: Mapping[str, Mapping[str, float]]
    noise: float = 0.01
    fail: set[str] = field(default_factory=set)
    calls: int = 0
    requests: list[MeasurementRequest] = field(default_factory=list)

    def __call__(self, config: TrialConfig, request: MeasurementRequest) -> Measurements:
        assert request.purpose == "proof" and (request.sizes in (SIZES, TWO_LARGE) or request.run > 0)
        self.requests.append(request)
        assert isinstance(request.trial, int) and (config is BASELINE) == (request.side == "baseline")
        self.calls += 1
        name = config.env.get("NAME", "")
        if request.side == "candidate" and name in self.fail:
            raise TrialFailed(f"{name} hung", kind="timeout")
        token = f"{name}|{request.trial}|{request.repeat}|{request.side}|{request.run}"
        rng = random.Random(hashlib.sha256(token.encode()).digest())
        samples = []
        for collective in request.collectives:
            for size in request.sizes:
                bucket = next(b for b in DEFAULT_BUCKETS if b.holds(size))
                truth = self.speedups.get(name, {})  # "COLLECTIVE BUCKET" for one collective, else "BUCKET"
                speedup = truth.get(f"{collective} {bucket.name}", truth.get(bucket.name, 1.0))
                speedup = speedup if request.side == "candidate" else 1.0
                t = (10.0 + size / 1e4) / speedup * math.exp(rng.gauss(0, self.noise))
                samples.append(SizeSample(collective, size, t, size / t / 1e3, "ring", "simple", 8))
        return Measurements(tuple(samples), simulated=True)


def config_of(params: Mapping[str, Any], attrs: Mapping[str, Any]) -> TrialConfig:
    return TrialConfig(env={"NAME": str(params["name"])}, rank_order=ORDER, tuner_table=str(attrs.get("table", "")))


def prove(
    model: Model,
    names: list[str],
    *,
    buckets: Mapping[str, float] | None = None,
    study: optuna.Study | None = None,
    pairs: int = 4,
    max_pairs: int = 12,
    on_pair: Callable[[int, int], None] = lambda done, total: None,
    sizes: tuple[int, ...] = SIZES,
    collectives: tuple[str, ...] = ("all_reduce",),
    **settings: float,
) -> tuple[list[FinalistProof], optuna.Study]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if study is None:
        study = optuna.create_study(direction="maximize")
        for i, name in enumerate(names):
            study.add_trial(
                optuna.trial.create_trial(
                    value=1.5 + i,
                    params={"name": name},
                    distributions={"name": CategoricalDistribution(names)},
                    user_attrs={"table": f"# table of {name}"},
                )
            )
    prover = Prover(
        ProofSettings(sizes=sizes, pairs=pairs, max_pairs=max_pairs, **settings),
        objective=Objective(WorkloadProfile(dict.fromkeys(collectives, 1.0), dict(buckets or {}))),
        evaluate=model,
        baseline_config=BASELINE,
        config_of=config_of,
        on_pair=on_pair,
    )
    finalists = study.get_trials(deepcopy=False)
    return prover.prove(study, finalists), study


ALL_FASTER = {b.name: 1.2 for b in DEFAULT_BUCKETS}


def test_a_clear_win_is_decided_and_chosen_at_the_first_look() -> None:
    model = Model({"win": ALL_FASTER})
    progress: list[tuple[int, int]] = []
    [proof], _ = prove(model, ["win"], on_pair=lambda done, total: progress.append((done, total)))
    assert progress == [(1, 12), (2, 12), (3, 12), (4, 12)], "each measured pair, out of the most it may take"
    assert proof.trial == 0 and proof.search_value == 1.5 and proof.failure is None
    assert proof.config.env == {"NAME": "win"} and proof.config.tuner_table == "# table of win"
    assert proof.promoted and all(b.decision is Decision.FASTER for b in proof.buckets)
    assert model.calls == 2 * 4, "one look of four pairs, two sides each"
    assert all(b.comparison.pairs == 4 and b.decided_at == 4 for b in proof.buckets)
    assert proof.speedup == pytest.approx(1.2, rel=0.01)
    assert proof.baseline is not None and proof.candidate is not None


def test_small_sizes_are_run_again_within_each_pair_and_their_bounds_narrow_by_about_half() -> None:
    unchanged = {"flat": {b.name: 1.0 for b in DEFAULT_BUCKETS}}
    once = Model(unchanged, noise=0.03)
    [single], _ = prove(once, ["flat"], pairs=12, max_pairs=12)
    four = Model(unchanged, noise=0.03)
    [runs], study = prove(four, ["flat"], pairs=12, max_pairs=12, small_runs=4)
    small = (1024, 65536)  # below 1 MiB
    first = [(r.side, r.sizes, r.run) for r in four.requests[:8]]
    assert first == [
        ("baseline", SIZES, 0),
        ("candidate", SIZES, 0),
        *[(side, small, run) for run in (1, 2, 3) for side in ("baseline", "candidate")],
    ], "the full ladder once per side, then the small sizes three more times, sides alternating"
    assert four.calls == 12 * 8 and once.calls == 12 * 2
    assert len(json.loads(study.user_attrs["proof:0:0"])["small_runs"]) == 3
    before, after = ({b.bucket.name: math.log(b.ci_high / b.ci_low) for b in p.buckets} for p in (single, runs))
    for name in ("0-1K", "1K-64K"):
        assert 0.3 < after[name] / before[name] < 0.75, name  # sqrt(1/4) = 0.5 expected
    for name in ("1M-16M", "16M-4G"):
        assert after[name] == pytest.approx(before[name]), "one run at 1 MiB and above"
    assert all(b.decision.safe for b in runs.buckets if b.bucket.name in ("0-1K", "1K-64K"))
    assert not all(b.decision.safe for b in single.buckets if b.bucket.name in ("0-1K", "1K-64K"))


def test_small_runs_must_be_at_least_one() -> None:
    with pytest.raises(ConfigError, match=r"^small_runs: must be at least 1, got 0$"):
        ProofSettings(sizes=SIZES, small_runs=0)
    assert ProofSettings(sizes=SIZES, small_runs=1).small_sizes == ()
    assert ProofSettings(sizes=SIZES, small_runs=2, small_bytes=65536).small_sizes == (1024,)
    assert ProofSettings(sizes=(1024, 65536), small_runs=4).small_sizes == (), "all small: more pairs do that job"


def test_extra_runs_are_only_of_small_sizes_and_stored_with_their_pair() -> None:
    large = Model({"win": ALL_FASTER})
    prove(large, ["win"], sizes=TWO_LARGE, small_runs=4)
    assert large.calls == 2 * 4 and all(r.run == 0 for r in large.requests), "no small size: one run per side"
    two = Model({"win": ALL_FASTER})
    _, study = prove(two, ["win"], small_runs=2)
    assert two.calls == 4 * 4, "each side's full ladder, then one more run of its small sizes"
    assert [len(json.loads(study.user_attrs[f"proof:0:{i}"])["small_runs"]) for i in range(4)] == [1] * 4
    once = Model({"win": ALL_FASTER})
    _, study = prove(once, ["win"], small_runs=1)
    assert "small_runs" not in json.loads(study.user_attrs["proof:0:0"]), "a pair of one run per side stores no extra"


def test_a_bucket_shown_slower_stops_the_finalist_at_once_and_it_is_never_chosen() -> None:
    model = Model({"trade": {**ALL_FASTER, "1M-16M": 0.92}})
    [proof], _ = prove(model, ["trade"])
    decisions = {b.bucket.name: b.decision for b in proof.buckets}
    assert decisions["1M-16M"] is Decision.SLOWER and decisions["16M-4G"] is Decision.FASTER
    assert not proof.promoted and model.calls == 2 * 4


def test_an_undecided_bucket_gets_more_looks_up_to_the_maximum() -> None:
    model = Model({"close": {**ALL_FASTER, "64K-1M": 0.985}}, noise=0.02)
    [proof], _ = prove(model, ["close"])
    close = next(b for b in proof.buckets if b.bucket.name == "64K-1M")
    assert close.comparison.pairs == 12 and model.calls == 2 * 12, "looks at 4, 8 and 12 pairs"
    assert close.decision is Decision.NOT_SHOWN_SAFE and not proof.promoted
    assert close.ci_low < 0.98 <= close.ci_high


def test_a_collective_whose_buckets_are_all_decided_gets_no_more_pairs_and_keeps_its_decisions() -> None:
    both = ("all_reduce", "reduce_scatter")
    truth = {"mixed": {**ALL_FASTER, "all_reduce 0-1K": 0.985}}  # only all_reduce has a bucket near the floor
    model = Model(truth, noise=0.012)
    [proof], _ = prove(model, ["mixed"], collectives=both)
    assert {r.collectives for r in model.requests if r.repeat < 4} == {both}, "the first look measures all"
    assert {r.collectives for r in model.requests if r.repeat >= 4} == {("all_reduce",)}, "later looks: the open one"
    assert model.calls == 2 * 12
    buckets = {(b.collective, b.bucket.name): b for b in proof.buckets}
    assert buckets["all_reduce", "0-1K"].comparison.pairs == 12
    assert buckets["all_reduce", "0-1K"].decision is Decision.NOT_SHOWN_SAFE and not proof.promoted
    # The same measurements with all_reduce clear as well: everything decided at the first look.
    [first_look], _ = prove(Model({"mixed": ALL_FASTER}, noise=0.012), ["mixed"], collectives=both)
    assert first_look.promoted
    for b in first_look.buckets:
        if b.collective == "reduce_scatter":
            kept = buckets[b.collective, b.bucket.name]
            assert kept.decision is b.decision is Decision.FASTER
            assert (kept.ci_low, kept.ci_high, kept.speedup, kept.comparison.pairs) == (
                b.ci_low,
                b.ci_high,
                b.speedup,
                4,
            ), "its bounds are those of the look that decided it"


def test_a_collective_with_a_gain_still_to_show_is_measured_on_beside_an_unsafe_one() -> None:
    only_large = {"0-1K": 0.0, "1K-64K": 0.0, "64K-1M": 0.0, "1M-16M": 0.0}
    truth = {"gain": {"all_reduce 16M-4G": 0.985, "reduce_scatter 16M-4G": 1.045}}
    model = Model(truth, noise=0.010)
    [proof], _ = prove(model, ["gain"], collectives=("all_reduce", "reduce_scatter"), buckets=only_large)
    looked = {(r.collectives, r.repeat) for r in model.requests}
    assert (("all_reduce", "reduce_scatter"), 4) in looked, "the measured gain keeps reduce_scatter in the next look"
    assert all(b.comparison.pairs > 4 for b in proof.weighted)


def test_a_marginal_bucket_decided_at_a_later_look_reports_that_look() -> None:
    model = Model({"later": {**ALL_FASTER, "0-1K": 1.0}}, noise=0.012)
    [proof], _ = prove(model, ["later"], pairs=3, max_pairs=30)
    flat = next(b for b in proof.buckets if b.bucket.name == "0-1K")
    assert flat.decision is Decision.NO_DIFFERENCE and proof.promoted
    assert 3 < flat.decided_at == flat.comparison.pairs < 30, "stopped at the look that decided it"


def test_a_bucket_the_workload_weighs_zero_does_not_block_the_choice() -> None:
    model = Model({"trade": {**ALL_FASTER, "0-1K": 0.5}})
    [proof], _ = prove(model, ["trade"], buckets={"0-1K": 0.0})
    assert proof.promoted, "only weighted buckets must be shown safe"
    assert all(b.bucket.name != "0-1K" for b in proof.buckets), "an unweighted bucket is not tested at all"
    assert all(b.weight > 0 for b in proof.buckets)


def test_all_safe_but_none_faster_is_not_chosen_and_not_measured_on() -> None:
    model = Model({"flat": {}}, noise=0.002)
    [proof], _ = prove(model, ["flat"])
    assert all(b.decision is Decision.NO_DIFFERENCE for b in proof.buckets)
    assert not proof.promoted and model.calls == 2 * 4, "no gain measured: no more looks"


def test_a_resumed_proof_measures_nothing_again_and_decides_the_same() -> None:
    model = Model({"close": {**ALL_FASTER, "64K-1M": 0.985}, "win": ALL_FASTER}, noise=0.02)
    first, study = prove(model, ["close", "win"])
    calls = model.calls
    progress: list[tuple[int, int]] = []
    again, _ = prove(model, ["close", "win"], study=study, on_pair=lambda d, t: progress.append((d, t)))
    assert model.calls == calls and progress == [], "nothing measured, nothing reported as measured"
    assert [[b.decision for b in p.buckets] for p in again] == [[b.decision for b in p.buckets] for p in first]
    assert [p.speedup for p in again] == [p.speedup for p in first]


def test_a_finalist_whose_measurement_fails_is_recorded_and_never_chosen() -> None:
    model = Model({"hangs": ALL_FASTER, "win": ALL_FASTER}, fail={"hangs"})
    proofs, study = prove(model, ["hangs", "win"])
    hangs, win = proofs
    assert hangs.failure == "timeout: hangs hung" and not hangs.promoted and hangs.buckets == ()
    assert (hangs.trial, hangs.search_value, hangs.speedup, hangs.baseline) == (0, 1.5, 0.0, None)
    assert hangs.config.env == {"NAME": "hangs"}
    assert model.calls == 2 + 2 * 4, "the failed finalist's first pair (its candidate side raised), the other's look"
    assert win.promoted and win.search_value == 2.5
    assert "proof:0:failed" in study.user_attrs


def test_more_pairs_are_needed_at_min_effect_and_max_loss_from_the_settings() -> None:
    # A 6% gain is "faster" at the default 3% minimum effect, not at 10%.
    model = Model({"gain": {b.name: 1.06 for b in DEFAULT_BUCKETS}}, noise=0.002)
    [default], _ = prove(model, ["gain"])
    [strict], _ = prove(Model(model.speedups, noise=0.010), ["gain"], min_effect=0.10)
    assert all(b.decision is Decision.FASTER for b in default.buckets)
    assert all(b.decision is Decision.NO_DIFFERENCE for b in strict.buckets)
    assert strict.buckets[0].comparison.p_margin > 0.5 > default.buckets[0].comparison.p_margin
    # At maxLoss 10% a 1.5% loss is safe at the first look, while a noisy bucket keeps the finalist measured.
    model = Model({"mixed": {**ALL_FASTER, "0-1K": 0.985, "64K-1M": 0.97}}, noise=0.004)
    [loose], _ = prove(model, ["mixed"], max_loss=0.10)
    small = next(b for b in loose.buckets if b.bucket.name == "0-1K")
    assert small.decision.safe and small.decided_at == 4
    assert not prove(Model(model.speedups, noise=0.010), ["mixed"])[0][0].promoted, "at 2% it is not safe"


def test_a_finalist_never_measured_has_too_few_pairs_and_two_pairs_are_enough() -> None:
    study = optuna.create_study(direction="maximize")
    study.add_trial(
        optuna.trial.create_trial(
            value=1.3, params={"name": "x"}, distributions={"name": CategoricalDistribution(["x"])}
        )
    )
    prover = Prover(
        ProofSettings(sizes=SIZES, pairs=2, max_pairs=2),
        objective=Objective(WorkloadProfile({"all_reduce": 1})),
        evaluate=Model({"x": ALL_FASTER}, noise=0.0),
        baseline_config=BASELINE,
        config_of=config_of,
    )
    [unmeasured] = prover.decide(study, study.get_trials())
    assert unmeasured.failure == "too few pairs" and unmeasured.buckets == () and unmeasured.search_value == 1.3
    assert unmeasured.config.env == {"NAME": "x"}
    [proof] = prover.prove(study, study.get_trials())
    assert proof.failure is None and proof.promoted and proof.buckets[0].comparison.pairs == 2


def proof_of(trial: int, speedups: Mapping[str, tuple[float, float, Decision]]) -> FinalistProof:
    """A finalist with the given (point speedup, lower bound, decision) per bucket of all_reduce."""
    buckets = []
    for b in DEFAULT_BUCKETS:
        point, low, decision = speedups.get(b.name, (1.0, 0.99, Decision.NO_DIFFERENCE))
        comparison = compare([100.0, 100.0], [100.0 / point, 100.0 / point])
        bounds = Bounds(low, point * 1.05, decision is Decision.FASTER, 4)
        buckets.append(BucketProof("all_reduce", b, comparison, decision, bounds, 1.0))
    speedup = math.exp(sum(math.log(b.comparison.speedup) for b in buckets) / len(buckets))
    return FinalistProof(trial, BASELINE, 1.5, tuple(buckets), speedup, None, None)


FAST = (1.5, 1.4, Decision.FASTER)


def test_the_trade_off_names_what_would_accept_it() -> None:
    trade = proof_of(
        3, {"1M-16M": (0.95, 0.95, Decision.SLOWER), "0-1K": (0.99, 0.97, Decision.NOT_SHOWN_SAFE), "16M-4G": FAST}
    )
    safe = proof_of(4, {"16M-4G": (1.1, 1.05, Decision.FASTER)})
    assert safe.promoted and not trade.promoted and trade.speedup > safe.speedup
    t = tradeoff([safe, trade], safe)
    assert t is not None and t.proof is trade
    assert [b.bucket.name for b in t.unsafe] == ["0-1K", "1M-16M"]
    assert t.max_loss == 0.05, "the lowest bound, 0.95, passes at maxLoss 0.050 exactly"
    assert t.zero_buckets == ("0-1K", "1M-16M")
    assert t.accepts() == [
        "workload.buckets: {0-1K: 0, 1M-16M: 0} (stop weighing the sizes it slows), then run again",
        "search.maxLoss: 0.050 (accept a loss this large in those buckets)",
    ]
    assert tradeoff([safe, trade], trade) is None, "nothing unchosen beats the chosen one"
    assert tradeoff([safe], None) is None, "a finalist that can be chosen is no trade-off"
    assert tradeoff([trade], None) is not None, "without a chosen one, anything above the defaults"
    slow = proof_of(5, {"1M-16M": (0.5, 0.4, Decision.SLOWER)})
    assert tradeoff([slow], None) is None, "below the defaults overall: no trade-off"


def test_the_best_of_several_trade_offs_is_named_ties_to_the_earlier_trial() -> None:
    worse = proof_of(1, {"1M-16M": (0.95, 0.95, Decision.SLOWER), "16M-4G": (1.3, 1.2, Decision.FASTER)})
    better = proof_of(2, {"1M-16M": (0.95, 0.95, Decision.SLOWER), "16M-4G": FAST})
    twin = proof_of(0, {"1M-16M": (0.95, 0.95, Decision.SLOWER), "16M-4G": FAST})
    t = tradeoff([worse, better], None)
    assert t is not None and t.proof is better
    t = tradeoff([worse, better, twin], None)
    assert t is not None and t.proof is twin


def test_a_trade_off_whose_loss_is_beyond_any_max_loss_or_whose_gain_sits_in_the_lost_bucket() -> None:
    hopeless = proof_of(1, {"1M-16M": (0.9, 0.0004, Decision.NOT_SHOWN_SAFE), "16M-4G": FAST})
    t = tradeoff([hopeless], None)
    assert t is not None and t.max_loss is None, "a maxLoss of 1 or more is no setting"
    assert t.accepts() == ["workload.buckets: {1M-16M: 0} (stop weighing the sizes it slows), then run again"]
    # The only faster bucket is the one weighing 0 would drop (bucket weights hold for every collective).
    same = proof_of(
        2,
        {"16M-4G": (1.5, 0.97, Decision.NOT_SHOWN_SAFE), "1M-16M": FAST, "0-1K": (0.99, 0.9, Decision.NOT_SHOWN_SAFE)},
    )
    t = tradeoff([same], None)
    assert t is not None and t.zero_buckets == ("0-1K", "16M-4G")
    lone = proof_of(3, {"16M-4G": (1.5, 0.97, Decision.NOT_SHOWN_SAFE)})
    t = tradeoff([lone], None)
    assert t is not None and t.zero_buckets == () and t.max_loss is None
    assert t.accepts() == ["nothing short of new measurements: no weighted bucket was shown faster"]


def test_progress_counts_pairs_per_finalist_and_a_failed_pair_is_not_progress() -> None:
    model = Model({"a": ALL_FASTER, "b": ALL_FASTER}, fail={"b"})
    progress: list[tuple[int, int]] = []
    prove(model, ["a", "b"], on_pair=lambda done, total: progress.append((done, total)))
    assert progress == [(1, 24), (2, 24), (3, 24), (4, 24)], "b's first pair failed: nothing measured for it"
    progress.clear()
    prove(Model({"a": ALL_FASTER, "b": ALL_FASTER}), ["a", "b"], on_pair=lambda d, t: progress.append((d, t)))
    assert [d for d, _ in progress] == [1, 2, 3, 4, 13, 14, 15, 16], "the second finalist counts from its share"


def test_all_safe_with_a_gain_still_to_show_gets_more_looks() -> None:
    model = Model({"gain": {**{b.name: 1.0 for b in DEFAULT_BUCKETS}, "16M-4G": 1.045}}, noise=0.012)
    [proof], _ = prove(model, ["gain"], pairs=3, max_pairs=30)
    big = next(b for b in proof.buckets if b.bucket.name == "16M-4G")
    assert big.comparison.pairs > 3, "a measured 4.5% gain not yet shown: more pairs"
    assert all(b.decision.safe for b in proof.buckets)
    # Only the large bucket weighed: safe at the first look, the gain not shown yet, but measured beyond 3%.
    only_large = {"0-1K": 0.0, "1K-64K": 0.0, "64K-1M": 0.0, "1M-16M": 0.0}
    model = Model({"gain": {"16M-4G": 1.045}}, noise=0.010)
    [first], _ = prove(model, ["gain"], pairs=4, max_pairs=4, buckets=only_large)
    [big] = first.weighted
    assert big.decision is Decision.NO_DIFFERENCE and big.comparison.speedup > 1.03, "the case this is about"
    [proof], _ = prove(Model(model.speedups, noise=0.010), ["gain"], pairs=4, max_pairs=30, buckets=only_large)
    assert proof.weighted[0].comparison.pairs > 4
    # ... while a measured gain below the minimum effect stops at the first look.
    flat = Model({"flat": {"16M-4G": 1.01}}, noise=0.004)
    [stopped], _ = prove(flat, ["flat"], pairs=4, max_pairs=30, buckets=only_large)
    assert stopped.weighted[0].comparison.pairs == 4 and stopped.weighted[0].decision.safe


def test_max_loss_decides_when_a_bucket_is_done_and_alpha_sets_the_reported_level() -> None:
    # At maxLoss 10%, a 1.5% loss is settled at the first look while a bucket at the floor keeps the finalist
    # measured: the settled bucket reports the first look.
    model = Model({"m": {**ALL_FASTER, "0-1K": 0.985, "1M-16M": 0.90}}, noise=0.004)
    [proof], _ = prove(model, ["m"], max_loss=0.10, alpha=0.05)
    small = next(b for b in proof.buckets if b.bucket.name == "0-1K")
    floor = next(b for b in proof.buckets if b.bucket.name == "1M-16M")
    assert floor.comparison.pairs == 12 and small.decided_at == 4 and small.decision.safe
    assert small.comparison.confidence == pytest.approx(0.95)


def test_a_bucket_of_several_sizes_is_their_geometric_mean_and_the_profiles_are_per_size() -> None:
    model = Model({"w": {"16M-4G": 1.25}}, noise=0.0)
    [proof], _ = prove(model, ["w"], sizes=TWO_LARGE)
    [bucket] = [b for b in proof.buckets if b.bucket.name == "16M-4G"]
    assert bucket.comparison.speedup == pytest.approx(1.25)
    assert proof.baseline is not None and proof.candidate is not None and proof.candidate.simulated
    for size in TWO_LARGE:
        base, tuned = proof.baseline.get("all_reduce", size), proof.candidate.get("all_reduce", size)
        assert base is not None and tuned is not None
        assert base.time_us == pytest.approx(10.0 + size / 1e4) and tuned.time_us == pytest.approx(base.time_us / 1.25)
        assert tuned.busbw_gbs == pytest.approx(size / tuned.time_us / 1e3)
        assert (tuned.collective, tuned.algorithm, tuned.protocol, tuned.channels) == (
            "all_reduce",
            "ring",
            "simple",
            8,
        )


def test_the_mean_profile_is_the_geometric_mean_over_the_pairs() -> None:
    model = Model({"n": ALL_FASTER}, noise=0.05)
    [proof], study = prove(model, ["n"])
    runs = []
    n = proof.buckets[0].comparison.pairs
    assert n > 4
    for i in range(n):
        sides = json.loads(study.user_attrs[f"proof:0:{i}"])
        runs.append(Measurements.from_json(sides["candidate"]))
    assert proof.candidate is not None
    for s in proof.candidate.samples:
        times = [r.get(s.collective, s.bytes).time_us for r in runs]  # type: ignore[union-attr]
        assert s.time_us == pytest.approx(math.exp(sum(math.log(t) for t in times) / n))


def test_the_trade_off_max_loss_rounds_up_to_the_next_thousandth() -> None:
    trade = proof_of(1, {"1M-16M": (0.95, 0.9477, Decision.SLOWER), "16M-4G": FAST})
    t = tradeoff([trade], None)
    assert t is not None and t.max_loss == 0.053, "1 - 0.9477 = 0.0523: 0.053 accepts it, 0.052 does not"
