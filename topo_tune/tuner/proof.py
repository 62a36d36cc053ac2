"""The proof: re-measure the best finalists against NCCL's defaults and decide which, if any, ships.

Purpose: each finalist is measured interleaved with the baseline (A B A B …), one pair per step, every
(collective, bucket) at once; the pairs are stored in the study as they are measured, so a resumed proof
continues where it stopped and reaches the same decisions. The pairs come in looks of ``proofPairs`` up to
``proofPairsMax`` (``statistics.SequentialDesign``): a finalist gets its next look only while some weighted
bucket is neither shown safe nor shown slower, or while all are safe, none is shown faster yet and one measured
a gain beyond ``min_effect``; never after a weighted bucket was shown slower.

Small sizes are noisy (launch jitter is a larger share of a short call) and fast: within each pair of a
ladder that also has large sizes, the sizes below ``small_bytes`` are measured ``small_runs`` times per
side, interleaved (A B A B … on those sizes after the pair's full-ladder A B), and each side's time per size
is the geometric mean of its runs. The design is
fixed before any data are seen (every pair gets the same runs), so the pairs stay independent and alike and
the t bounds and their alpha spending hold as before; the pair's spread at small sizes shrinks by about
``sqrt(small_runs)``, which is what lets a truly unchanged small bucket be shown within ``maxLoss``.

A finalist can be chosen only when every (collective, bucket) the workload weighs is shown safe (its lower
bound is at least ``1 - maxLoss``) and at least one is shown faster; the chosen one is the best such by
weighted speedup. The best finalist that was not chosen but measured faster overall is the **trade-off**: it
is named with what would accept it, never shipped as the result.

Non-goals: the statistics themselves (``statistics``), the search (``study``), writing files (``outputs``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial

from topo_tune.errors import ConfigError, TrialFailed
from topo_tune.tuner import statistics
from topo_tune.tuner.evaluation import Evaluator, MeasurementRequest, measure_all, requested
from topo_tune.tuner.objective import BucketScore, Measurements, Objective, SizeBucket
from topo_tune.tuner.space import TrialConfig
from topo_tune.tuner.speedup_text import speedup_text

__all__ = [
    "SMALL_BYTES",
    "SMALL_RUNS",
    "BucketProof",
    "FinalistProof",
    "ProofSettings",
    "Prover",
    "Tradeoff",
    "tradeoff",
]

S_PROOF = "proof"
SMALL_BYTES = 1 << 20
"""Sizes below this are measured ``SMALL_RUNS`` times per side in every pair (latency-bound: a run is cheap)."""
SMALL_RUNS = 4


@dataclass(frozen=True)
class ProofSettings:
    sizes: tuple[int, ...]
    pairs: int = 10
    max_pairs: int = 30
    alpha: float = statistics.DEFAULT_ALPHA
    min_effect: float = statistics.DEFAULT_MIN_EFFECT
    max_loss: float = statistics.DEFAULT_MAX_LOSS
    small_bytes: int = SMALL_BYTES
    small_runs: int = 1  # the study asks for SMALL_RUNS

    def __post_init__(self) -> None:
        if self.small_runs < 1:
            raise ConfigError("small_runs", f"must be at least 1, got {self.small_runs}")

    @property
    def small_sizes(self) -> tuple[int, ...]:
        """The sizes every pair measures ``small_runs`` times per side.

        None when ``small_runs`` is 1, and none when every size is small: the extra runs are cheap next to a
        pair's large sizes; without any, a run costs as much as a pair, and the looks' extra pairs already
        measure an undecided bucket again.
        """
        if self.small_runs == 1 or all(s < self.small_bytes for s in self.sizes):
            return ()
        return tuple(s for s in self.sizes if s < self.small_bytes)

    @property
    def design(self) -> statistics.SequentialDesign:
        return statistics.SequentialDesign(self.pairs, self.max_pairs, self.alpha)


@dataclass(frozen=True)
class BucketProof:
    """The proof of one (collective, bucket) for one finalist."""

    collective: str
    bucket: SizeBucket
    comparison: statistics.Comparison  # over every pair measured (p-value, CVs)
    decision: statistics.Decision
    bounds: statistics.Bounds | None = None  # the sequential running bounds the decision rests on
    weight: float = 1.0

    @property
    def speedup(self) -> float:
        """The point speedup every output shows: from the pairs its bounds rest on, within them."""
        return self.bounds.point if self.bounds is not None else self.comparison.speedup

    @property
    def ci_low(self) -> float:
        return self.bounds.low if self.bounds is not None else self.comparison.ci_low

    @property
    def ci_high(self) -> float:
        return self.bounds.high if self.bounds is not None else self.comparison.ci_high

    @property
    def decided_at(self) -> int:
        return self.bounds.decided_at if self.bounds is not None else self.comparison.pairs

    @property
    def text(self) -> str:
        """The speedup with its bounds as every output writes it (``speedup_text``)."""
        c = self.comparison
        cv = max(c.cv_baseline, c.cv_candidate)
        return speedup_text(self.speedup, (self.ci_low, self.ci_high), pairs=self.decided_at, cv=cv)


@dataclass(frozen=True)
class FinalistProof:
    """A finalist re-measured against the baseline, pair by pair."""

    trial: int
    config: TrialConfig
    search_value: float
    buckets: tuple[BucketProof, ...]
    speedup: float  # weighted geometric mean of the per-bucket point speedups
    baseline: Measurements | None  # per size, geometric mean over the pairs (for plots and tables)
    candidate: Measurements | None
    failure: str | None = None

    @property
    def weighted(self) -> tuple[BucketProof, ...]:
        return tuple(b for b in self.buckets if b.weight > 0)

    @property
    def interval(self) -> tuple[float, float] | None:
        """A conservative interval of the weighted speedup: the weighted geometric mean of the buckets' bounds.

        It holds whatever the buckets' correlation (the perfectly correlated case, the widest), and it holds
        ``speedup`` (the same mean of points each within its bounds). None without a weighted bucket.
        """
        weighted = self.weighted
        total = sum(b.weight for b in weighted)
        if not weighted or any(b.ci_low <= 0 for b in weighted):
            return None
        low = math.exp(sum(b.weight * math.log(b.ci_low) for b in weighted) / total)
        high = math.exp(sum(b.weight * math.log(b.ci_high) for b in weighted) / total)
        return low, high

    @property
    def text(self) -> str:
        """The weighted speedup with its conservative interval, as every output writes it."""
        interval = self.interval
        if interval is None:
            return f"{self.speedup:.3f}x"
        cv = max((max(b.comparison.cv_baseline, b.comparison.cv_candidate) for b in self.weighted), default=0.0)
        pairs = min(b.decided_at for b in self.weighted)
        return speedup_text(self.speedup, interval, pairs=pairs, cv=cv)

    @property
    def promoted(self) -> bool:
        """Every weighted bucket shown safe, at least one shown faster (an intersection-union test)."""
        weighted = self.weighted
        return (
            self.failure is None
            and bool(weighted)
            and all(b.decision.safe for b in weighted)
            and any(b.decision is statistics.Decision.FASTER for b in weighted)
        )


@dataclass(frozen=True)
class Tradeoff:
    """The best finalist that was measured faster overall but could not be chosen, and what would accept it."""

    proof: FinalistProof
    unsafe: tuple[BucketProof, ...]  # weighted buckets not shown safe
    max_loss: float | None  # the search.maxLoss at which the measured bounds would accept it
    zero_buckets: tuple[str, ...]  # workload.buckets to weigh 0 so that only shown-safe buckets count

    def accepts(self) -> list[str]:
        """What would accept it, as a user would change cluster.yaml."""
        out = []
        if self.zero_buckets:
            weights = ", ".join(f"{name}: 0" for name in self.zero_buckets)
            out.append(f"workload.buckets: {{{weights}}} (stop weighing the sizes it slows), then run again")
        if self.max_loss is not None:
            out.append(f"search.maxLoss: {self.max_loss:.3f} (accept a loss this large in those buckets)")
        if not out:
            out.append("nothing short of new measurements: no weighted bucket was shown faster")
        return out


def tradeoff(proofs: Sequence[FinalistProof], chosen: FinalistProof | None) -> Tradeoff | None:
    """The finalist with the best weighted speedup when it is not the chosen one and beats it (or the defaults)."""
    floor = chosen.speedup if chosen is not None else 1.0
    candidates = [p for p in proofs if p.failure is None and not p.promoted and p.buckets and p.speedup > floor]
    best = max(candidates, key=lambda p: (p.speedup, -p.trial), default=None)
    if best is None:
        return None
    weighted = best.weighted
    unsafe = tuple(b for b in weighted if not b.decision.safe)
    faster = [b for b in weighted if b.decision is statistics.Decision.FASTER]
    needed: float | None = None
    if faster and unsafe:
        # The smallest maxLoss (in thousandths) its lowest bound passes; never 1 or more (cluster.yaml's range).
        needed = math.ceil(round((1.0 - min(b.ci_low for b in unsafe)) * 1000, 6)) / 1000
        needed = needed if needed < 1 else None
    names = tuple(dict.fromkeys(b.bucket.name for b in unsafe))
    # Weighing a bucket 0 drops it for every collective: only useful when a faster bucket survives that.
    survivors = [b for b in faster if b.bucket.name not in names]
    return Tradeoff(best, unsafe, needed, names if survivors else ())


class Prover:
    """Runs and decides the proof of a study's finalists; its pairs live in the study's user attributes."""

    def __init__(
        self,
        settings: ProofSettings,
        *,
        objective: Objective,
        evaluate: Evaluator,
        baseline_config: TrialConfig,
        config_of: Callable[[Mapping[str, Any], Mapping[str, Any]], TrialConfig],
        on_pair: Callable[[int, int], None] = lambda done, total: None,
    ) -> None:
        self.settings = settings
        self.objective = objective
        self._evaluate = evaluate
        self._baseline_config = baseline_config
        self._config_of = config_of
        self._on_pair = on_pair
        self._design = settings.design

    def prove(self, study: optuna.Study, finalists: Sequence[FrozenTrial]) -> list[FinalistProof]:
        """Measure each finalist look by look until it is decided or at ``max_pairs``, then decide all.

        A look after the first measures only the collectives with a weighted bucket still open
        (``_open_collectives``): a collective whose every bucket is decided gets no more pairs.
        """
        total = len(finalists) * self.settings.max_pairs
        for index, finalist in enumerate(finalists):
            config = self._config_of(finalist.params, finalist.user_attrs)
            look: int | None = self.settings.pairs
            collectives = self.objective.collectives
            while look is not None:
                for pair in range(look):
                    if self._failed(study, finalist.number):
                        break
                    if self._measure_pair(study, finalist.number, config, pair, collectives):
                        self._on_pair(index * self.settings.max_pairs + pair + 1, total)
                collectives = self._open_collectives(study, finalists, finalist.number)
                if not collectives:
                    break
                look = self._design.next_look(look)
        return self.decide(study, finalists)

    def decide(self, study: optuna.Study, finalists: Sequence[FrozenTrial]) -> list[FinalistProof]:
        """The decisions on the stored pairs (what ``prove`` returns; also for a finished study)."""
        raw = [self._raw(study, f) for f in finalists]
        series = [s for _, _, per_bucket in raw for s in per_bucket]
        bounds = iter(self._design.bounds(series, min_effect=self.settings.min_effect, max_loss=self.settings.max_loss))
        out = []
        for finalist, (pairs, failure, per_bucket) in zip(finalists, raw, strict=True):
            config = self._config_of(finalist.params, finalist.user_attrs)
            search_value = finalist.value if finalist.value is not None else 0.0
            if failure is not None or len(pairs) < 2:
                for _ in per_bucket:
                    next(bounds)
                out.append(
                    FinalistProof(
                        finalist.number, config, search_value, (), 0.0, None, None, failure or "too few pairs"
                    )
                )
                continue
            buckets = []
            for (collective, bucket), series_of in zip(self._buckets(), per_bucket, strict=True):
                b = next(bounds)
                comparison = statistics.compare(
                    [x for x, _ in series_of],
                    [y for _, y in series_of],
                    alpha=self.settings.alpha,
                    min_effect=self.settings.min_effect,
                )
                weight = self.objective.profile.weight(collective, bucket.name)
                buckets.append(
                    BucketProof(collective, bucket, comparison, b.decision(self.settings.max_loss), b, weight)
                )
            speedup = self.objective.combine(
                BucketScore(b.collective, b.bucket, b.speedup, 0.0, 0.0, ()) for b in buckets
            )
            out.append(
                FinalistProof(
                    finalist.number,
                    config,
                    search_value,
                    tuple(buckets),
                    speedup,
                    _mean_profile([a for a, _ in pairs]),
                    _mean_profile([b for _, b in pairs]),
                )
            )
        return out

    # ---------------------------------------------------------------- internals

    @staticmethod
    def _failed(study: optuna.Study, trial: int) -> bool:
        return f"{S_PROOF}:{trial}:failed" in study.user_attrs

    def _measure_pair(
        self, study: optuna.Study, trial: int, config: TrialConfig, pair: int, collectives: tuple[str, ...]
    ) -> bool:
        """Measure and store pair ``pair`` of ``trial`` (of ``collectives``) unless it is stored; whether it was
        measured now.

        The pair is one full-ladder run per side, then ``small_runs - 1`` more runs of the small sizes per
        side, sides alternating. A failed measurement is stored as the finalist's failure (no further pair is
        measured for it).
        """
        key = f"{S_PROOF}:{trial}:{pair}"
        if key in study.user_attrs:
            return False
        small = self.settings.small_sizes
        plan: list[tuple[Literal["baseline", "candidate"], TrialConfig, tuple[int, ...], int]] = []
        for run in range(self.settings.small_runs if small else 1):
            sizes = self.settings.sizes if run == 0 else small
            plan += [("baseline", self._baseline_config, sizes, run), ("candidate", config, sizes, run)]
        runs: list[dict[str, str]] = [{} for _ in range(len(plan) // 2)]
        asked = [
            (cfg, MeasurementRequest(collectives, sizes, trial, "proof", pair, side, run))
            for side, cfg, sizes, run in plan
        ]
        try:
            # The whole pair at once where the evaluator can (one benchmark job, its runs in the plan's order).
            got = measure_all(self._evaluate, asked)
            for (side, _, _, run), (_, request), measured in zip(plan, asked, got, strict=True):
                runs[run][side] = requested(measured, request).to_json()
        except TrialFailed as failure:
            study.set_user_attr(f"{S_PROOF}:{trial}:failed", f"{failure.kind}: {failure.reason}")
            return False
        stored: dict[str, Any] = dict(runs[0])
        if len(runs) > 1:
            stored["small_runs"] = runs[1:]
        study.set_user_attr(key, json.dumps(stored))
        return True

    def _open_collectives(self, study: optuna.Study, finalists: Sequence[FrozenTrial], trial: int) -> tuple[str, ...]:
        """The collectives ``trial``'s next look measures; none: the finalist is decided (no more looks).

        A finalist needs another look while no weighted bucket is slower and its choice is still open: some
        bucket not shown safe, or all shown safe, none shown faster, and one that measured a gain beyond
        ``min_effect``. That look measures only the collectives with an open bucket: one not shown safe, or
        one shown safe but not faster that measured such a gain. A collective left out is left out of every
        later look too (its buckets' bounds no longer move, and a look that lacks a bucket's pairs tests its
        gain with p = 1), so each bucket's pairs are the first ones of the finalist, as the bounds need.
        """
        proofs = self.decide(study, [f for f in finalists if self._stored(study, f.number)])
        proof = next((p for p in proofs if p.trial == trial), None)
        if proof is None or proof.failure is not None:
            return ()
        weighted = proof.weighted
        decisions = [b.decision for b in weighted]
        if statistics.Decision.SLOWER in decisions:
            return ()  # can never be chosen
        gain = [
            b
            for b in weighted
            if b.decision is statistics.Decision.NO_DIFFERENCE and b.comparison.speedup > 1 + self.settings.min_effect
        ]
        if statistics.Decision.NOT_SHOWN_SAFE in decisions:
            open_buckets = [b for b in weighted if b.decision is statistics.Decision.NOT_SHOWN_SAFE] + gain
        elif statistics.Decision.FASTER not in decisions:
            open_buckets = gain  # every bucket shown safe: more pairs only while a gain is still to show
        else:
            open_buckets = []
        measured = {b.collective for b in open_buckets}
        return tuple(c for c in self.objective.collectives if c in measured)

    @staticmethod
    def _stored(study: optuna.Study, trial: int) -> bool:
        return f"{S_PROOF}:{trial}:0" in study.user_attrs

    def _buckets(self) -> list[tuple[str, SizeBucket]]:
        return [
            (collective, bucket)
            for collective in self.objective.collectives
            for bucket in self.objective.buckets
            # A bucket the workload weighs 0 is neither measured nor tested: it would only dilute the others' alpha.
            if any(bucket.holds(s) for s in self.settings.sizes)
            and self.objective.profile.weight(collective, bucket.name) > 0
        ]

    def _raw(
        self, study: optuna.Study, finalist: FrozenTrial
    ) -> tuple[list[tuple[Measurements, Measurements]], str | None, list[list[tuple[float, float]]]]:
        attrs = study.user_attrs
        pairs = []
        runs: list[tuple[list[Measurements], list[Measurements]]] = []  # per pair: every run of each side
        for pair in range(self.settings.max_pairs):
            raw = attrs.get(f"{S_PROOF}:{finalist.number}:{pair}")
            if raw is None:
                break
            sides = json.loads(raw)
            first = (Measurements.from_json(sides["baseline"]), Measurements.from_json(sides["candidate"]))
            pairs.append(first)
            extra = sides.get("small_runs", [])
            runs.append(
                (
                    [first[0], *(Measurements.from_json(r["baseline"]) for r in extra)],
                    [first[1], *(Measurements.from_json(r["candidate"]) for r in extra)],
                )
            )
        failure = attrs.get(f"{S_PROOF}:{finalist.number}:failed")
        per_bucket = []
        for collective, bucket in self._buckets():
            sizes = [s for s in self.settings.sizes if bucket.holds(s)]
            # The pairs that measured this collective: the first ones (a later look may leave it out, never back).
            measured = runs[: _measuring(runs, collective)]
            per_bucket.append(
                [(_geomean_time(a, collective, sizes), _geomean_time(b, collective, sizes)) for a, b in measured]
            )
        if failure is not None or len(pairs) < 2:
            per_bucket = [[] for _ in per_bucket]
        return pairs, failure, per_bucket


def _measuring(runs: Sequence[tuple[Sequence[Measurements], Sequence[Measurements]]], collective: str) -> int:
    """How many of a finalist's first pairs measured ``collective``."""
    return sum(
        1 for _ in itertools.takewhile(lambda run: any(s.collective == collective for s in run[0][0].samples), runs)
    )


def _geomean_time(runs: Sequence[Measurements], collective: str, sizes: Sequence[int]) -> float:
    """Over the bucket's sizes, the geometric mean of each size's time (itself the geometric mean of its runs)."""
    logs = []
    for size in sizes:
        samples = [m.get(collective, size) for m in runs]
        times = [math.log(s.time_us) for s in samples if s is not None]
        assert times  # requested() kept exactly the requested sizes of every stored proof run; run 0 has them all
        logs.append(sum(times) / len(times))
    return math.exp(sum(logs) / len(logs))


def _mean_profile(runs: Sequence[Measurements]) -> Measurements:
    """Per (collective, size): the geometric mean time over the runs, busbw recomputed to match."""
    first = runs[0]
    samples = []
    for s in first.samples:
        others = [m.get(s.collective, s.bytes) for m in runs]
        times = [o.time_us for o in others if o is not None]
        t = math.exp(sum(math.log(x) for x in times) / len(times))
        samples.append(
            type(s)(s.collective, s.bytes, t, s.busbw_gbs * s.time_us / t, s.algorithm, s.protocol, s.channels)
        )
    return Measurements(tuple(samples), simulated=any(m.simulated for m in runs))
