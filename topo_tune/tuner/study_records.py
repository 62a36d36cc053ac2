"""What a study hands back: its trials as stored, its outcome, and its progress while it runs.

Non-goals: running the study (``study``), writing files from the outcome (``outputs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from optuna.trial import FrozenTrial, TrialState

from topo_tune.tuner import statistics
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.proof import FinalistProof, Tradeoff, tradeoff
from topo_tune.tuner.space import RankOrder, SearchSpace
from topo_tune.tuner.trial_store import (
    A_ATTEMPT,
    A_FAILURE,
    A_MEASUREMENTS,
    A_REASON,
    A_TABLE,
    TrialRole,
    from_optuna,
    has_every_param,
    logical_trials,
    role_of,
    superseded_trials,
    trial_config,
)

__all__ = [
    "StudyOutcome",
    "StudyProgress",
    "TrialRecord",
    "plural",
    "study_outcome",
    "study_progress",
    "trial_count_line",
    "trial_counts",
    "trial_record",
]


@dataclass(frozen=True)
class TrialRecord:
    """One trial as stored: what it ran and what came of it."""

    number: int
    state: str  # complete | pruned | failed | wrong_result | timeout | stale | running | waiting
    role: TrialRole
    params: Mapping[str, str]
    env: Mapping[str, str]
    rank_order: str
    value: float | None
    reason: str | None
    intermediate: tuple[tuple[int, float], ...]
    measurements: Measurements | None
    attempt: int
    superseded: bool  # a stale trial whose retry is another record
    tuner_table: str = ""  # the candidate table a "table" trial ran with


@dataclass(frozen=True)
class StudyOutcome:
    """Everything a study found; ``chosen`` is None when the answer is "keep NCCL's defaults"."""

    name: str
    sampler: str
    seed: int
    space_fingerprint: str
    baseline: TrialRecord
    best: TrialRecord | None
    trials: tuple[TrialRecord, ...]
    proofs: tuple[FinalistProof, ...]
    chosen: FinalistProof | None
    simulated: bool
    natural_order: RankOrder
    site_fixed: Mapping[str, str] = field(default_factory=dict)
    tradeoff: Tradeoff | None = None
    """The best finalist measured faster overall that could not be chosen (never the result)."""
    max_loss: float = statistics.DEFAULT_MAX_LOSS
    alpha: float = statistics.DEFAULT_ALPHA
    min_effect: float = statistics.DEFAULT_MIN_EFFECT


@dataclass(frozen=True)
class StudyProgress:
    phase: Literal["search", "proof", "done"]
    done: int
    total: int
    best_value: float | None
    eta_s: float | None


def trial_record(space: SearchSpace, t: FrozenTrial, *, superseded: bool) -> TrialRecord:
    """One trial of the study as stored."""
    # A trial killed inside ask() holds only some params: shown as they are, with no configuration.
    complete = has_every_param(space, t.params)
    params = from_optuna(space, t.params)
    config = trial_config(space, t.params, t.user_attrs) if complete else None
    state = {
        TrialState.COMPLETE: "complete",
        TrialState.PRUNED: "pruned",
        TrialState.RUNNING: "running",
        TrialState.WAITING: "waiting",
    }.get(t.state, str(t.user_attrs.get(A_FAILURE, "failed")))
    raw = t.user_attrs.get(A_MEASUREMENTS)
    return TrialRecord(
        number=t.number,
        state=state,
        role=role_of(t.user_attrs),
        params=params,
        env=dict(config.env) if config else {},
        rank_order=config.rank_order.name if config else "",
        value=t.value if t.state == TrialState.COMPLETE else None,
        # A pruned trial of a study from before pruning recorded why still says what happened to it.
        reason=t.user_attrs.get(A_REASON) or ("pruned (partial speedup hopeless)" if state == "pruned" else None),
        intermediate=tuple(sorted(t.intermediate_values.items())),
        measurements=Measurements.from_json(raw) if raw else None,
        attempt=int(t.user_attrs.get(A_ATTEMPT, 1)),
        superseded=superseded,
        tuner_table=str(t.user_attrs.get(A_TABLE, "")),
    )


def study_outcome(
    trials: Sequence[FrozenTrial],
    proofs: Sequence[FinalistProof],
    space: SearchSpace,
    *,
    name: str,
    sampler: str,
    seed: int,
    max_loss: float,
    alpha: float,
    min_effect: float,
) -> StudyOutcome:
    """The outcome of a study's stored trials and its finalists' proofs."""
    superseded = superseded_trials(trials)
    records = tuple(trial_record(space, t, superseded=t.number in superseded) for t in trials)
    baseline = next(r for r in records if r.role is TrialRole.BASELINE and r.state == "complete")
    searched = [
        r for r in records if r.state == "complete" and r.role is not TrialRole.BASELINE and r.value is not None
    ]
    best = max(searched, key=lambda r: (r.value or 0.0, -r.number), default=None)
    promoted = [p for p in proofs if p.promoted]
    chosen = max(promoted, key=lambda p: (p.speedup, -p.trial), default=None)
    alternative = tradeoff(proofs, chosen)
    simulated = any(r.measurements is not None and r.measurements.simulated for r in records)
    return StudyOutcome(
        name=name,
        sampler=sampler,
        seed=seed,
        space_fingerprint=space.fingerprint(),
        baseline=baseline,
        best=best,
        trials=records,
        proofs=tuple(proofs),
        chosen=chosen,
        simulated=simulated,
        natural_order=space.rank_orders[0],
        site_fixed=dict(space.site_fixed),
        tradeoff=alternative,
        max_loss=max_loss,
        alpha=alpha,
        min_effect=min_effect,
    )


def trial_counts(outcome: StudyOutcome) -> dict[str, int]:
    """The study's stored trials counted as the outputs show them: ``trials`` (every one counted once),
    ``in_budget`` (the search's: baseline, topology candidates, sampled), each of those roles, ``after_budget``
    (channel table and per-size trials, run after the budget), ``superseded`` (stale runs whose retry counts
    instead), ``finalists`` (proven against the defaults)."""
    counted = [t for t in outcome.trials if not t.superseded]
    after = sum(1 for t in counted if t.role.has_table)  # run after the budget, each with a table
    return {
        "trials": len(counted),
        "in_budget": len(counted) - after,
        "baseline": sum(1 for t in counted if t.role == TrialRole.BASELINE),
        "candidate": sum(1 for t in counted if t.role == TrialRole.CANDIDATE),
        "sampled": sum(1 for t in counted if t.role == TrialRole.SAMPLED),
        "after_budget": after,
        "superseded": len(outcome.trials) - len(counted),
        "finalists": len(outcome.proofs),
    }


def trial_count_line(outcome: StudyOutcome, budget: int | None = None) -> str:
    """How many trials ran and why that is not the budget: ``59 trials: 40 of the search budget of 40
    (1 baseline, 3 topology candidates, 36 sampled), 19 per-size/table trials after it (not in the budget),
    1 stale run measured again (not counted)`` (counts of ``trial_counts``)."""
    n = trial_counts(outcome)
    parts = [
        plural(n["baseline"], "baseline") if n["baseline"] else "",
        plural(n["candidate"], "topology candidate") if n["candidate"] else "",
        f"{n['sampled']} sampled" if n["sampled"] else "",
    ]
    inside = ", ".join(p for p in parts if p)
    of = f"{n['in_budget']} of the search budget" + ("" if budget is None else f" of {budget}")
    line = plural(n["trials"], "trial") + (f": {of} ({inside})" if inside else "")
    if n["after_budget"]:
        line += f", {plural(n['after_budget'], 'per-size/table trial')} after it (not in the budget)"
    if n["superseded"]:
        line += f", {plural(n['superseded'], 'stale run')} measured again (not counted)"
    return line


def plural(count: int, noun: str) -> str:
    """``1 finalist``, ``2 finalists``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def study_progress(
    phase: Literal["search", "proof", "done"],
    trials: Sequence[FrozenTrial],
    budget: int,
    per_trial_s: float | None,
    *,
    done: int | None = None,
    total: int | None = None,
) -> StudyProgress:
    """Where the study stands: the proof's pairs when given, else its finished trials out of the budget."""
    finished = [t for t in logical_trials(trials) if t.state.is_finished()]
    values = [t.value for t in finished if t.state == TrialState.COMPLETE and t.value is not None]
    if done is None or total is None:
        # The table trials come after the budget's searched trials: each adds itself to the total once asked for.
        tables = sum(1 for t in logical_trials(trials) if role_of(t.user_attrs).has_table)
        done, total = len(finished), budget + tables
    eta = per_trial_s * max(total - done, 0) if per_trial_s is not None and phase == "search" else None
    return StudyProgress(phase, done, total, max(values) if values else None, eta)
