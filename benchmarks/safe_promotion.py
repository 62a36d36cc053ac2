"""Safe promotion: does the proof ever ship a per-bucket loss, and how much of the safe gain does it keep?

Each landscape is a ``sim`` cluster with a workload; each seed runs the study in-process (the same
``run_study`` that ``init`` runs, the ``sim`` model called directly instead of through agents and gRPC; noise
seeded by the study seed) over a small space: every rank order the pass offers, and the knobs ``channels``,
``ib_qps`` and ``nthreads`` (``nvls`` for ``ib_qps`` on the one-node landscape), then the channel table and
the per-size search through the tuner plugin (``search.tunerTable``, on by default). The whole space is then
swept noise-free (the model's ``model_time_us``), each configuration both as it is and with its best
per-bucket rows (per weighted bucket, the algorithm/protocol entry NCCL offered there that is fastest, or
none):

* **safe oracle** — the best weighted speedup among configurations whose true speedup is at least
  ``1 - maxLoss`` in every weighted (collective, bucket) (NCCL's defaults, 1.0, included);
* **unconstrained best** — the best weighted speedup, whatever it loses somewhere (a trade-off).

Per seed it prints the outcome, the promoted configuration's true per-bucket speedups (each weighted
bucket, the minimum and the weighted mean), both references (per bucket too), whether a trade-off was
named (and whether it is within 2% of the unconstrained best), trials, proof pairs and wall time. "Fixed
proof" is the rule the proof had before (promote when some bucket's gain beyond 3% is significant after Holm
and no loss beyond 3% is; ``proofPairs`` pairs per finalist), applied to the first ``proofPairs`` pairs of
the same run, for comparison.

Landscapes:

* ``demo`` — the README demo (2 racks x 4 nodes, slow ECMP spine), all_reduce 2 : all_gather 1, every bucket
  weighed: the rack-grouped ring doubles large messages but slows tree-sized all_reduce (a trade-off).
* ``demo-large`` — the same cluster, a workload of >= 16 MiB messages only: a safe win exists.
* ``defaults-optimal`` — one 8-GPU NVSwitch node: nothing beats NCCL's defaults.
* ``uneven-racks`` — racks of 3, 2 and 3 nodes behind a 4:1 spine, hostnames interleaved, all_reduce only
  (this benchmark's own trade-off landscape: orders and channel counts help some sizes and hurt others).

Usage: python -m benchmarks.safe_promotion [--seeds 20] [--landscape demo ...] [--budget 60] [--proof-pairs 10]
(every study setting else is ``init``'s default: the size ladder, rungs, finalists, proofPairsMax, maxLoss)
Targets (issue 16): 0 promoted buckets with true speedup < 0.98; 0 promotions on defaults-optimal; promoted
gain >= 90% of the safe oracle's (mean over seeds); a trade-off named in >= 90% of seeds where the
unconstrained best is not safe.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import statistics as stats
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from scipy import stats as sp

from topo_tune.sim import Cluster, SpineTier, defaults_optimal_cluster, demo_cluster
from topo_tune.sim.demo import h100_node
from topo_tune.tuner import statistics
from topo_tune.tuner.objective import DEFAULT_LADDER, Measurements, Objective, SizeBucket, WorkloadProfile
from topo_tune.tuner.sim_evaluator import SimEvaluator, sim_space
from topo_tune.tuner.size_options import Option, offered_by_bucket, option_table, table_text
from topo_tune.tuner.space import SearchSpace, TrialConfig
from topo_tune.tuner.study import MeasurementRequest, StudyOutcome, StudySettings, run_study

LADDER = DEFAULT_LADDER  # StudySettings' defaults are `init`'s when cluster.yaml leaves `search` alone
MAX_LOSS = StudySettings.max_loss
SMALL = {"0-1K": 0.0, "1K-64K": 0.0, "64K-1M": 0.0, "1M-16M": 0.0}


@dataclass(frozen=True)
class PromotionLandscape:
    name: str
    cluster: Callable[[], Cluster]
    collectives: dict[str, float]
    buckets: dict[str, float]
    knobs: tuple[str, ...] = ("channels", "ib_qps", "nthreads")


def uneven_racks() -> Cluster:
    sizes = {"rack-a": 3, "rack-b": 2, "rack-c": 3}
    members = [(rack, i) for rack, n in sizes.items() for i in range(n)]
    # Hostnames interleave the racks, so NCCL's natural (sorted) order crosses the spine at almost every hop.
    order = sorted(members, key=lambda m: (m[1], m[0]))
    nodes = tuple(h100_node(f"gpu-{k + 1:02d}", rack) for k, (rack, _) in enumerate(order))
    return Cluster(
        nodes=nodes,
        spine=SpineTier(oversubscription=4.0, ecmp_paths=2, latency_us=2.0),
        rail_optimized=True,
        name="uneven racks 3/2/3 x 8 H100, 4:1 spine",
    )


LANDSCAPES = {
    "demo": PromotionLandscape("demo", demo_cluster, {"all_reduce": 2, "all_gather": 1}, {}),
    "demo-large": PromotionLandscape("demo-large", demo_cluster, {"all_reduce": 2, "all_gather": 1}, SMALL),
    "defaults-optimal": PromotionLandscape(
        "defaults-optimal",
        defaults_optimal_cluster,
        {"all_reduce": 1, "all_gather": 1},
        {},
        ("channels", "nthreads", "nvls"),  # one node: no network knob applies
    ),
    "uneven-racks": PromotionLandscape("uneven-racks", uneven_racks, {"all_reduce": 1}, {}),
}


def rack_grouped(cluster: Cluster) -> list[str]:
    return [n for rack in cluster.racks for n in cluster.node_names if cluster.node(n).rack == rack]


@dataclass(frozen=True)
class Truth:
    weighted: float
    buckets: dict[tuple[str, str], float]  # weighted buckets only
    rows: int = 0  # per-bucket rows of the oracle's table (0: the configuration as it is)

    @property
    def worst(self) -> float:
        return min(self.buckets.values(), default=1.0)

    @property
    def safe(self) -> bool:
        return self.worst >= 1 - MAX_LOSS

    def per_bucket(self, objective: Objective) -> str:
        """Every weighted bucket's true speedup, "/" between buckets, " · " between collectives (NCCL's
        defaults, which have no buckets here, are 1.00 everywhere)."""
        return " · ".join(
            "/".join(f"{self.buckets.get((c, b.name), 1.0):.2f}" for b in _weighted(objective, c))
            for c in objective.collectives
        )


def _weighted(objective: Objective, collective: str) -> list[SizeBucket]:
    return [b for b in objective.buckets if objective.profile.weight(collective, b.name) > 0]


class Oracle:
    """Noise-free truth of any configuration, cached."""

    def __init__(self, cluster: Cluster, space: SearchSpace, objective: Objective) -> None:
        self.objective = objective
        self.space = space
        self.quiet = SimEvaluator(cluster, noise=False)
        self.request = MeasurementRequest(objective.collectives, LADDER, 0, "search")
        self.baseline = self.quiet(space.config(space.baseline_params()), self.request)
        self.nodes = len(cluster.node_names)
        self.ranks = sum(cluster.node(n).gpus for n in cluster.node_names)
        self._cache: dict[tuple[object, ...], Truth] = {}

    def truth(self, config: TrialConfig) -> Truth:
        key = (tuple(sorted(config.env.items())), config.rank_order.nodes, config.tuner_table)
        if key not in self._cache:
            measured: Measurements = self.quiet(config, self.request)
            scores = self.objective.bucket_scores(measured, self.baseline)
            weighted = {
                (s.collective, s.bucket.name): s.speedup
                for s in scores
                if self.objective.profile.weight(s.collective, s.bucket.name) > 0
            }
            self._cache[key] = Truth(self.objective.combine(scores), weighted)
        return self._cache[key]

    def with_rows(self, config: TrialConfig) -> Truth:
        """The configuration with its best per-bucket rows: per weighted bucket, the entry NCCL offered there at
        every size that is fastest (noise-free), if one beats the configuration itself; the table measured whole."""
        plain = self.truth(config)
        offered = offered_by_bucket(self.quiet(config, self.request), self.objective)
        best: dict[tuple[str, str], tuple[float, str]] = {}
        for entry in sorted(set().union(*offered.values())):
            covered = frozenset(key for key, entries in offered.items() if entry in entries)
            table = option_table(Option(entry, None), covered, self.objective, nodes=self.nodes, ranks=self.ranks)
            forced = self.truth(dataclasses.replace(config, tuner_table=table))
            for collective, bucket in covered:
                key = (collective, bucket.name)
                if forced.buckets[key] > max(plain.buckets[key], best.get(key, (0.0, ""))[0]):
                    best[key] = (
                        forced.buckets[key],
                        Option(entry, None).row(collective, bucket, nodes=self.nodes, ranks=self.ranks),
                    )
        if not best:
            return plain
        rows = [row for _, row in best.values()]
        composed = self.truth(dataclasses.replace(config, tuner_table=table_text(rows)))
        return dataclasses.replace(composed, rows=len(rows))

    def sweep(self) -> tuple[Truth, Truth]:
        """(safe oracle, unconstrained best) over the whole space, each configuration with and without rows."""
        best = safe = Truth(1.0, {})
        for values in itertools.product(*(self.space.values_of(n) for n in self.space.names)):
            config = self.space.config(dict(zip(self.space.names, values, strict=True)))
            for t in (self.truth(config), self.with_rows(config)):
                if t.weighted > best.weighted:
                    best = t
                if t.safe and t.weighted > safe.weighted:
                    safe = t
        return safe, best


def _rows(truth: Truth) -> str:
    return f"{truth.rows} per-bucket rows" if truth.rows else "no rows"


def fixed_proof_promotes(outcome: StudyOutcome, storage: str, objective: Objective, pairs: int) -> int | None:
    """The finalist the fixed-size proof (the rule before this one) would have promoted, on the same pairs."""
    study = optuna.load_study(study_name=outcome.name, storage=storage)
    attrs = study.user_attrs
    promoted = []
    flat: list[tuple[int, float, float]] = []  # (finalist, p gain beyond 3%, p loss beyond 3%)
    for proof in outcome.proofs:
        runs = []
        for i in range(pairs):
            raw = attrs.get(f"proof:{proof.trial}:{i}")
            if raw is None:
                break
            sides = json.loads(raw)
            runs.append((Measurements.from_json(sides["baseline"]), Measurements.from_json(sides["candidate"])))
        if len(runs) < 2:
            continue
        for collective in objective.collectives:
            for bucket in objective.buckets:
                sizes = [s for s in LADDER if bucket.holds(s)]
                if not sizes:
                    continue
                a = [_geo(m, collective, sizes) for m, _ in runs]
                b = [_geo(m, collective, sizes) for _, m in runs]
                d = [math.log(x / y) for x, y in zip(a, b, strict=True)]
                mean = sum(d) / len(d)
                sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1))
                se = sd / math.sqrt(len(d))
                if se == 0:
                    p_gain = 0.0 if mean > math.log1p(0.03) else 1.0
                    p_loss = 0.0 if mean < math.log1p(-0.03) else 1.0
                else:
                    p_gain = float(sp.t.sf((mean - math.log1p(0.03)) / se, len(d) - 1))
                    p_loss = float(sp.t.cdf((mean - math.log1p(-0.03)) / se, len(d) - 1))
                flat.append((proof.trial, p_gain, p_loss))
    gains = statistics.holm([g for _, g, _ in flat], 0.01)
    losses = statistics.holm([lo for _, _, lo in flat], 0.01)
    for proof in outcome.proofs:
        mine = [i for i, f in enumerate(flat) if f[0] == proof.trial]
        if mine and any(gains[i] for i in mine) and not any(losses[i] for i in mine):
            promoted.append(proof)
    best = max(promoted, key=lambda p: p.speedup, default=None)
    return None if best is None else best.trial


def _geo(m: Measurements, collective: str, sizes: Sequence[int]) -> float:
    logs = []
    for size in sizes:
        sample = m.get(collective, size)
        assert sample is not None
        logs.append(math.log(sample.time_us))
    return math.exp(sum(logs) / len(logs))


def run(landscape: PromotionLandscape, seeds: int, budget: int, proof_pairs: int) -> dict[str, float]:
    cluster = landscape.cluster()
    space = sim_space(
        cluster,
        nccl_version="2.28.3",
        collectives=list(landscape.collectives),
        optimized=rack_grouped(cluster),
        knobs=list(landscape.knobs),
    )
    objective = Objective(WorkloadProfile(landscape.collectives, landscape.buckets))
    oracle = Oracle(cluster, space, objective)
    safe, best = oracle.sweep()
    print(f"\n## {landscape.name}: {cluster.name} (SIMULATED)")
    print(
        f"space {math.prod(len(space.values_of(n)) for n in space.names)} configs, each also with its best "
        f"per-bucket rows; safe oracle {safe.weighted:.3f}x ({_rows(safe)}); unconstrained best "
        f"{best.weighted:.3f}x ({_rows(best)}; worst bucket {best.worst:.3f}, {'safe' if best.safe else 'NOT safe'})"
    )
    order = " · ".join(f"{c} " + "/".join(b.name for b in _weighted(objective, c)) for c in objective.collectives)
    print(
        f"true speedup per weighted bucket ({order}): safe oracle {safe.per_bucket(objective)}; "
        f"unconstrained best {best.per_bucket(objective)}"
    )
    print(
        "| seed | outcome | promoted true weighted | promoted true worst bucket | promoted true per bucket | "
        "trade-off named | trade-off true weighted | fixed proof (before) | its true worst bucket | trials | "
        "proof pairs | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    gains, unsafe_promoted, promotions, named, close, walls, pairs_used, old_unsafe = [], 0, 0, 0, 0, [], [], 0
    for seed in range(seeds):
        with tempfile.TemporaryDirectory() as tmp:
            storage = f"sqlite:///{Path(tmp) / 'study.db'}"
            settings = StudySettings(
                name=f"{landscape.name}-{seed}",
                storage=storage,
                budget=budget,
                seed=seed,
                proof_pairs=proof_pairs,
                proof_pairs_max=max(StudySettings.proof_pairs_max, proof_pairs),
                worker_id=f"bench-{seed}",
                table_shape=(oracle.nodes, oracle.ranks),  # as `init` runs it (search.tunerTable, the default)
            )
            started = time.perf_counter()
            outcome = run_study(settings, space=space, objective=objective, evaluate=SimEvaluator(cluster, seed=seed))
            wall = time.perf_counter() - started
            old = fixed_proof_promotes(outcome, storage, objective, proof_pairs)
        chosen = outcome.chosen
        truth = oracle.truth(chosen.config) if chosen is not None else Truth(1.0, {})
        promotions += chosen is not None
        unsafe_promoted += sum(1 for v in truth.buckets.values() if v < 1 - MAX_LOSS)
        gains.append(truth.weighted - 1)
        trade = outcome.tradeoff
        trade_truth = oracle.truth(trade.proof.config) if trade is not None else None
        if not best.safe:
            named += trade is not None
            close += trade_truth is not None and trade_truth.weighted >= best.weighted / 1.02
        old_proof = next((p for p in outcome.proofs if p.trial == old), None)
        old_truth = oracle.truth(old_proof.config) if old_proof is not None else None
        old_unsafe += old_truth is not None and not old_truth.safe
        pairs = sum(p.buckets[0].comparison.pairs for p in outcome.proofs if p.buckets)
        pairs_used.append(pairs)
        walls.append(wall)
        print(
            f"| {seed} | {'promote trial ' + str(chosen.trial) if chosen else 'keep defaults'} | "
            f"{truth.weighted:.3f} | {truth.worst:.3f} | {truth.per_bucket(objective)} | {'yes' if trade else 'no'} | "
            f"{f'{trade_truth.weighted:.3f}' if trade_truth else '-'} | "
            f"{'promote trial ' + str(old) if old is not None else 'keep defaults'} | "
            f"{f'{old_truth.worst:.3f}' if old_truth else '-'} | {len(outcome.trials)} | "
            f"{pairs} (fixed: {len(outcome.proofs) * proof_pairs}) | {wall:.1f} |"
        )
    safe_gain = safe.weighted - 1
    kept = stats.mean(gains) / safe_gain if safe_gain > 1e-9 else float("nan")
    print(
        f"\n{landscape.name}: promoted buckets with true speedup < {1 - MAX_LOSS:.2f}: {unsafe_promoted}; "
        f"promotions {promotions}/{seeds}; mean promoted gain {stats.mean(gains):+.3f} vs safe oracle "
        f"{safe_gain:+.3f} ({'n/a' if math.isnan(kept) else f'{kept:.0%}'}); "
        + (
            f"trade-off named {named}/{seeds} (within 2% of the unconstrained best: {close}/{seeds}); "
            if not best.safe
            else "unconstrained best is safe; "
        )
        + f"fixed proof (before) promoted an unsafe config in {old_unsafe}/{seeds}; "
        f"proof pairs mean {stats.mean(pairs_used):.1f}; wall mean {stats.mean(walls):.1f} s"
    )
    return {
        "unsafe_buckets": unsafe_promoted,
        "promotions": promotions,
        "kept": kept,
        "named": named,
        "seeds": seeds,
        "best_safe": float(best.safe),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=StudySettings.budget, help="trials per study (init's default)")
    parser.add_argument(
        "--proof-pairs", type=int, default=StudySettings.proof_pairs, help="pairs per look (init's default)"
    )
    parser.add_argument("--landscape", action="append", choices=sorted(LANDSCAPES))
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with contextlib.suppress(AttributeError):
        optuna.logging.disable_default_handler()
    print(
        f"# safe promotion (SIMULATED): {args.seeds} seeds, budget {args.budget}, proofPairs {args.proof_pairs}, "
        f"proofPairsMax {StudySettings.proof_pairs_max}, maxLoss {MAX_LOSS}, alpha {statistics.DEFAULT_ALPHA}, ladder "
        f"{LADDER[0]} B to {LADDER[-1] >> 20} MiB x{LADDER[1] // LADDER[0]} ({len(LADDER)} sizes)"
    )
    results = {
        name: run(LANDSCAPES[name], args.seeds, args.budget, args.proof_pairs) for name in args.landscape or LANDSCAPES
    }
    print("\n## targets")
    for name, r in results.items():
        checks = [f"unsafe promoted buckets {r['unsafe_buckets']:.0f} (target 0)"]
        if name == "defaults-optimal":
            checks.append(f"promotions {r['promotions']:.0f} (target 0)")
        elif not math.isnan(r["kept"]):
            checks.append(f"gain kept {r['kept']:.0%} of the safe oracle's (target >= 90%)")
        if not r["best_safe"]:
            checks.append(f"trade-off named {r['named']:.0f}/{r['seeds']:.0f} (target >= 90%)")
        print(f"- {name}: " + "; ".join(checks))


if __name__ == "__main__":
    main()
