"""A study's outcome in words and numbers: ``summary.json`` and the verdict lines ``init`` prints.

Every figure comes from the proof (speedups, bounds, pairs, decisions) and every count from the stored
trials (``study_records.trial_counts``), so the summary, the CLI and the report agree. Non-goals: writing
files (``outputs``), rendering the report (``report/``).
"""

from __future__ import annotations

from collections.abc import Mapping

from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.proof import FinalistProof, Tradeoff
from topo_tune.tuner.speedup_text import SEARCH_VS_PROOF, precise
from topo_tune.tuner.study import StudyOutcome
from topo_tune.tuner.study_records import trial_counts
from topo_tune.tuner.timeout_advice import TimeoutAdvice
from topo_tune.tuner.workload_gain import WorkloadSource, workload_gain

__all__ = ["SUMMARY_VERSION", "TRADEOFF", "bucket_lines", "summary", "verdict_lines"]

SUMMARY_VERSION = 2
TRADEOFF = "tradeoff"
"""The output subdirectory of the named trade-off's files."""


def summary(
    outcome: StudyOutcome,
    *,
    nccl_version: str,
    topology_fingerprint: str,
    config_version_id: str,
    advice: TimeoutAdvice | None,
    workload: WorkloadSource | None = None,
) -> dict[str, object]:
    """The machine-readable summary (``summary.json``). Each bucket row carries its workload weight (what the
    weighted speedup and its CI combine by) from the proof itself."""
    chosen = outcome.chosen
    shown = chosen or max(outcome.proofs, key=lambda p: p.speedup, default=None)
    site = dict(outcome.site_fixed)
    return {
        "version": SUMMARY_VERSION,
        "simulated": outcome.simulated,
        "study": {
            "name": outcome.name,
            "sampler": outcome.sampler,
            "seed": outcome.seed,
            "space_fingerprint": outcome.space_fingerprint,
        },
        "nccl_version": nccl_version,
        "topology_fingerprint": topology_fingerprint,
        "result": "promote" if chosen is not None else "keep NCCL's defaults",
        "config_version": config_version_id,
        "baseline": {
            "trial": outcome.baseline.number,
            "env": site,
            "rank_order": outcome.baseline.rank_order,
            "sizes": _profile(outcome.baseline.measurements),
        },
        "best": _best(outcome, site),
        "chosen": _chosen(outcome, site),
        "proven_trial": None if shown is None else shown.trial,
        "decision_rule": {
            "safe": "one-sided lower bound of the speedup >= 1 - max_loss in every weighted bucket",
            "faster": "gain beyond min_effect significant, Holm-corrected over every bucket of the proof",
            "max_loss": outcome.max_loss,
            "min_effect": outcome.min_effect,
            "alpha": outcome.alpha,
        },
        "buckets": _bucket_rows(shown),
        "tradeoff": _tradeoff(outcome.tradeoff, outcome),
        "finalists": _finalists(outcome),
        "trials": _trials(outcome, site),
        "counts": trial_counts(outcome),
        "timeout_advice": None if advice is None else advice.to_json(),
        "workload": workload_gain(chosen, workload or WorkloadSource()),
    }


def _best(outcome: StudyOutcome, site: Mapping[str, str]) -> dict[str, object] | None:
    best = outcome.best
    if best is None:
        return None
    return {
        "trial": best.number,
        "value": best.value,
        "env": {k: v for k, v in best.env.items() if k not in site},
        "rank_order": best.rank_order,
        "note": SEARCH_VS_PROOF,
    }


def _chosen(outcome: StudyOutcome, site: Mapping[str, str]) -> dict[str, object] | None:
    chosen = outcome.chosen
    if chosen is None:
        return None
    return {
        "trial": chosen.trial,
        "speedup": chosen.speedup,
        "ci_low": None if chosen.interval is None else chosen.interval[0],
        "ci_high": None if chosen.interval is None else chosen.interval[1],
        "speedup_text": chosen.text,
        "env": chosen.config.tuned_env(site),
        "rank_order": chosen.config.rank_order.name,
        "node_order": list(chosen.config.rank_order.nodes),
        "tuner_table": chosen.config.tuner_table,
    }


def _finalists(outcome: StudyOutcome) -> list[dict[str, object]]:
    chosen = outcome.chosen
    return [
        {
            "trial": p.trial,
            "search_value": p.search_value,
            "proven_speedup": p.speedup,
            "speedup_text": p.text if p.buckets else None,
            # Several finalists may pass the rule; only the chosen one (the best of those) ships.
            "passed": p.promoted,
            "promoted": chosen is not None and p.trial == chosen.trial,
            "failure": p.failure,
            "tuner_table": p.config.tuner_table,
        }
        for p in outcome.proofs
    ]


def _trials(outcome: StudyOutcome, site: Mapping[str, str]) -> list[dict[str, object]]:
    return [
        {
            "number": t.number,
            "state": t.state,
            "role": t.role,
            "value": t.value,
            "env": {k: v for k, v in t.env.items() if k not in site},
            "rank_order": t.rank_order,
            "attempt": t.attempt,
            "superseded": t.superseded,
            "reason": t.reason,
            "tuner_table": t.tuner_table,
        }
        for t in outcome.trials
    ]


def _bucket_rows(proof: FinalistProof | None) -> list[dict[str, object]]:
    if proof is None:
        return []
    return [
        {
            "collective": b.collective,
            "bucket": b.bucket.name,
            "min_bytes": b.bucket.min_bytes,
            "max_bytes": b.bucket.max_bytes,
            "scored_by": "time" if b.bucket.latency_bound else "busbw",
            "weight": b.weight,
            "decision": b.decision.value,
            "speedup": b.speedup,
            "ci_low": b.ci_low,
            "ci_high": b.ci_high,
            "speedup_text": b.text,
            "precise": precise(b.ci_low, b.ci_high),
            "confidence": b.comparison.confidence,
            "p_value": b.comparison.p_value,
            "p_value_min_effect": b.comparison.p_margin,
            "cv_baseline": b.comparison.cv_baseline,
            "cv_tuned": b.comparison.cv_candidate,
            "pairs": b.comparison.pairs,
            "decided_at_pairs": b.decided_at,
        }
        for b in proof.buckets
    ]


def _tradeoff(t: Tradeoff | None, outcome: StudyOutcome) -> dict[str, object] | None:
    if t is None:
        return None
    site = dict(outcome.site_fixed)
    return {
        "trial": t.proof.trial,
        "speedup": t.proof.speedup,
        "env": t.proof.config.tuned_env(site),
        "rank_order": t.proof.config.rank_order.name,
        "tuner_table": t.proof.config.tuner_table,
        "not_shown_safe": [{"collective": b.collective, "bucket": b.bucket.name} for b in t.unsafe],
        "accepted_by": t.accepts(),
        "accepted_by_max_loss": t.max_loss,
        "accepted_by_zero_buckets": list(t.zero_buckets),
        "files": TRADEOFF,
        "buckets": _bucket_rows(t.proof),
    }


def bucket_lines(proof: FinalistProof) -> list[str]:
    """One line per weighted bucket: its speedup and bounds (``BucketProof.text``), decision and pairs.

    A bucket decided at an earlier look keeps that look's point and bounds (``statistics.SequentialDesign``)
    while other buckets get more pairs, so the line says at how many pairs it was decided.
    """
    return [
        f"  {b.collective:<14} {b.bucket.name:<7} {b.text} {b.decision.value} "
        f"({_pairs(b.decided_at, b.comparison.pairs)})"
        for b in proof.weighted
    ]


def _pairs(decided_at: int, pairs: int) -> str:
    return f"{pairs} pairs" if decided_at >= pairs else f"decided at {decided_at} of {pairs} pairs"


def verdict_lines(outcome: StudyOutcome) -> list[str]:
    """What was decided, in words a user reads: the result, and the trade-off with what would accept it."""
    lines = []
    floor = f"lower bound >= {1 - outcome.max_loss:.3f}"
    if outcome.best is not None and outcome.best.value is not None:
        lines.append(f"search best: trial {outcome.best.number} at {outcome.best.value:.3f}x; {SEARCH_VS_PROOF}")
    if outcome.chosen is not None:
        lines.append(
            f"promoted trial {outcome.chosen.trial}: {outcome.chosen.text} the defaults (weighted); every "
            f"weighted bucket shown safe ({floor}) and one shown faster"
        )
        lines.extend(bucket_lines(outcome.chosen))
    else:
        lines.append(
            f"keep NCCL's defaults: no finalist was shown safe ({floor}) in every weighted bucket and faster in one"
        )
    t = outcome.tradeoff
    if t is not None:
        lines.append(
            f"trade-off (not the result): trial {t.proof.trial}, {t.proof.text} weighted, not shown safe in "
            + ", ".join(f"{b.collective} {b.bucket.name}" for b in t.unsafe)
        )
        lines.extend(bucket_lines(t.proof))
        lines.extend(f"  to accept it: {a}" for a in t.accepts())
        lines.append(f"  its files: {TRADEOFF}/")
    return lines


def _profile(m: Measurements | None) -> list[dict[str, object]]:
    if m is None:
        return []
    return [
        {"collective": s.collective, "bytes": s.bytes, "time_us": s.time_us, "busbw_gbs": s.busbw_gbs}
        for s in sorted(m.samples, key=lambda s: (s.collective, s.bytes))
    ]
