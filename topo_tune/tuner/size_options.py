"""Per-size search through the tuner plugin: NCCL's own (algorithm, protocol, channels) options per bucket.

Purpose: an environment or a rank order that helps some sizes often hurts others (a rack-grouped ring that
doubles large all_reduce slows the tree-sized messages). The tuner plugin can choose per collective and size,
but only among the entries NCCL offers (its cost table's entries that are not -1): forcing ``NCCL_ALGO``/
``NCCL_PROTO`` globally can pick unsafe ones, a plugin row cannot. After the environment/order search, for
each base (for the ``BASES`` best rank orders: the order's best configuration, the baseline included, and its
best rescue, see ``bases``):

1. **Options.** From the base's own measurements, the entries NCCL offered at every measured size of each
   weighted (collective, bucket) of the plugin's collectives. One option trial per entry: the base with a
   table forcing that entry in every weighted bucket that offers it (``algorithm,protocol,-1`` rows), except
   buckets where NCCL already picks it at every size (the row would change nothing there). One option trial
   per channel count that won a bucket during the search (``-1,-1,count`` rows: NCCL's entry, that count; at
   most ``MAX_CHANNEL_OPTIONS``). A table trial measures every bucket at once, so the budget is one trial per
   option, never per option x bucket.
2. **Composition.** Once a base's options are measured: per weighted bucket, the option that beat the base
   there by more than ``MARGIN`` (the best such) gives the bucket's row, an explicit ``algorithm,protocol``
   row, or a channel-only row where a channel count won. Buckets no option beat and buckets of weight 0 get
   no row: NCCL decides there exactly as under the base.

The composed table is measured as one more trial (role ``per_size``) and is then a finalist like any other:
it ships only by winning the study's proof, and what ships is exactly the table that was proven.

Non-goals: measuring and proving (the study does), NCCL's cost model, and per-size knobs no tuner can set.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topo_tune.plugin.table import ALGORITHMS, PROTOCOLS
from topo_tune.tuner.objective import BucketScore, Measurements, Objective, SizeBucket
from topo_tune.tuner.plugin_table import CHANNEL_VARIABLES, PLUGIN_COLLECTIVES, TABLE_HEADER, forced_channels
from topo_tune.tuner.trial_store import TrialRole

__all__ = [
    "BASES",
    "MARGIN",
    "MAX_CHANNEL_OPTIONS",
    "ROLES",
    "Option",
    "OptionRow",
    "PerSizeTable",
    "PlannedTrial",
    "StoredTrial",
    "bases",
    "compose",
    "offered_by_bucket",
    "options_for",
    "plan_next",
    "table_text",
]

ROLES = (TrialRole.OPTION, TrialRole.PER_SIZE)
"""The roles of the per-size search's trials."""
BASES = 2
"""How many of the best rank orders get a per-size search (each base costs its options plus one trial)."""
MARGIN = 0.01
"""How much faster than the base (in that bucket, one noisy measurement each) an option must be to get a row;
a row that only won on noise is caught by the proof, this keeps the candidate from collecting such rows."""
MAX_CHANNEL_OPTIONS = 2

_KEEP = "-1"


@dataclass(frozen=True)
class StoredTrial:
    """A trial of the study as the per-size search reads it."""

    number: int
    role: TrialRole
    """baseline | candidate | sampled | table | option | per_size"""
    key: str
    """An option's or composed table's key; empty for other trials."""
    finished: bool
    value: float | None
    """Set for completed trials."""
    env: Mapping[str, str]
    rank_order: str
    params: Mapping[str, Any]
    """The trial's stored (sampler-side) params: an option or composed trial re-uses its base's."""
    measurements: Measurements | None
    table: str = ""


@dataclass(frozen=True)
class Option:
    """One option of a base: an entry NCCL offered (channels NCCL's), or NCCL's entry with a channel count."""

    entry: str | None
    """``algorithm/protocol`` in the tuner table's names; None: NCCL's own."""
    channels: int | None

    @property
    def name(self) -> str:
        return self.entry if self.entry is not None else f"channels={self.channels}"

    def row(self, collective: str, bucket: SizeBucket, *, nodes: int, ranks: int) -> str:
        algorithm, protocol = self.entry.split("/") if self.entry is not None else (_KEEP, _KEEP)
        channels = str(self.channels) if self.channels is not None else _KEEP
        return ",".join(
            (
                PLUGIN_COLLECTIVES[collective],
                str(bucket.min_bytes),
                str(bucket.max_bytes),
                algorithm,
                protocol,
                channels,
                str(nodes),
                str(ranks),
            )
        )


@dataclass(frozen=True)
class PlannedTrial:
    """A trial to enqueue: an option of a base, or a base's composed table."""

    role: TrialRole
    key: str
    base: int
    params: Mapping[str, Any]
    table: str


@dataclass(frozen=True)
class OptionRow:
    collective: str
    bucket: SizeBucket
    option: Option
    speedup: float
    """The option's speedup over NCCL's defaults in this bucket, as measured in its option trial."""
    base_speedup: float
    """The base's, in the same bucket."""


@dataclass(frozen=True)
class PerSizeTable:
    base: int
    rows: tuple[OptionRow, ...]
    text: str


def offered_by_bucket(measurements: Measurements, objective: Objective) -> dict[tuple[str, SizeBucket], frozenset[str]]:
    """Per weighted (collective, bucket) of the plugin's collectives: the entries NCCL offered at every size.

    A bucket where some size came without NCCL's choice (a backend that does not report it) offers nothing.
    """
    out: dict[tuple[str, SizeBucket], frozenset[str]] = {}
    for collective in objective.collectives:
        if collective not in PLUGIN_COLLECTIVES:
            continue
        for bucket in objective.buckets:
            if objective.profile.weight(collective, bucket.name) <= 0:
                continue
            samples = [s for s in measurements.samples if s.collective == collective and bucket.holds(s.bytes)]
            if not samples:
                continue
            offered = frozenset(samples[0].offered)
            for s in samples[1:]:
                offered &= frozenset(s.offered)
            out[collective, bucket] = offered
    return out


def _nccl_always_picks(measurements: Measurements, collective: str, bucket: SizeBucket, entry: str) -> bool:
    return all(s.nccl == entry for s in measurements.samples if s.collective == collective and bucket.holds(s.bytes))


def options_for(
    base: StoredTrial,
    searched: Sequence[StoredTrial],
    baseline: Measurements,
    objective: Objective,
) -> dict[Option, frozenset[tuple[str, SizeBucket]]]:
    """The base's options, each with the (collective, bucket) its table covers; in a fixed order."""
    assert base.measurements is not None
    offered = offered_by_bucket(base.measurements, objective)
    entries: dict[str, set[tuple[str, SizeBucket]]] = {}
    for key, bucket_entries in offered.items():
        # A newer NCCL's entry the plugin cannot name (its record says "unknown/...") can be no row.
        for entry in filter(_nameable, bucket_entries):
            entries.setdefault(entry, set()).add(key)
    options: dict[Option, frozenset[tuple[str, SizeBucket]]] = {}
    for entry in sorted(entries, key=_entry_order):
        # A row forcing what NCCL already picks at every size of a bucket changes nothing there.
        covered = {(c, b) for c, b in entries[entry] if not _nccl_always_picks(base.measurements, c, b, entry)}
        if covered:
            options[Option(entry, None)] = frozenset(covered)
    for count in _channel_counts(base, searched, baseline, objective, frozenset(offered)):
        options[Option(None, count)] = frozenset(offered)
    return options


def _nameable(entry: str) -> bool:
    algorithm, _, protocol = entry.partition("/")
    return algorithm in ALGORITHMS and protocol in PROTOCOLS


def _entry_order(entry: str) -> tuple[int, int]:
    """NCCL's own order: algorithm index, then protocol index."""
    algorithm, _, protocol = entry.partition("/")
    return ALGORITHMS.index(algorithm), PROTOCOLS.index(protocol)


def _channel_counts(
    base: StoredTrial,
    searched: Sequence[StoredTrial],
    baseline: Measurements,
    objective: Objective,
    buckets: frozenset[tuple[str, SizeBucket]],
) -> list[int]:
    """Channel counts that won a bucket of the search against the base (most buckets won first)."""
    assert base.measurements is not None
    base_scores = {(s.collective, s.bucket): s.speedup for s in objective.bucket_scores(base.measurements, baseline)}
    cap = forced_channels(base.env)
    best: dict[tuple[str, SizeBucket], tuple[float, int]] = {}
    for trial in sorted(searched, key=lambda t: t.number):
        count = forced_channels(trial.env)
        if trial.measurements is None or count is None or count == cap or (cap is not None and count > cap):
            continue  # NCCL caps a row's count at the communicator's: a larger one is the base's count again
        for score in objective.bucket_scores(trial.measurements, baseline):
            key = (score.collective, score.bucket)
            if key in buckets and (key not in best or score.speedup > best[key][0]):
                best[key] = (score.speedup, count)
    wins: dict[int, int] = {}
    for key, (speedup, count) in best.items():
        if speedup > base_scores[key] * (1 + MARGIN):  # key is one of the base's measured buckets
            wins[count] = wins.get(count, 0) + 1
    ranked = sorted(wins, key=lambda c: (-wins[c], c))
    return ranked[:MAX_CHANNEL_OPTIONS]


def table_text(rows: Sequence[str]) -> str:
    """A tuner-plugin table of ``rows``, under the table's header line."""
    return "\n".join([f"# {TABLE_HEADER}", *rows]) + "\n"


def option_table(
    option: Option, covered: frozenset[tuple[str, SizeBucket]], objective: Objective, *, nodes: int, ranks: int
) -> str:
    """The table of one option trial: the option's row in every bucket it covers, in the objective's order."""
    rows = [
        option.row(c, b, nodes=nodes, ranks=ranks)
        for c in objective.collectives
        for b in objective.buckets
        if (c, b) in covered
    ]
    return table_text(rows)


def compose(
    base: StoredTrial,
    measured: Mapping[Option, tuple[frozenset[tuple[str, SizeBucket]], Measurements]],
    baseline: Measurements,
    objective: Objective,
    *,
    nodes: int,
    ranks: int,
) -> PerSizeTable | None:
    """Per weighted bucket, the option that beat the base there by more than ``MARGIN``; None if none did.

    Only an option whose table covered the bucket counts there, so a row only ever names an entry NCCL offered
    at every measured size of that bucket under the base (the plugin passes over a row whose entry NCCL
    rules out at some other size). Weight-0 buckets never get a row.
    """
    assert base.measurements is not None
    base_scores = {(s.collective, s.bucket): s.speedup for s in objective.bucket_scores(base.measurements, baseline)}
    option_scores = {
        option: {(s.collective, s.bucket): s.speedup for s in objective.bucket_scores(m, baseline)}
        for option, (_, m) in measured.items()
    }
    rows = []
    for collective in objective.collectives:
        if collective not in PLUGIN_COLLECTIVES:
            continue
        for bucket in objective.buckets:
            key = (collective, bucket)
            if objective.profile.weight(collective, bucket.name) <= 0 or key not in base_scores:
                continue
            floor = base_scores[key] * (1 + MARGIN)
            contenders = [
                (option_scores[option][key], option)
                for option, (covered, _) in measured.items()
                if key in covered and key in option_scores[option]
            ]
            winners = [(speedup, option) for speedup, option in contenders if speedup > floor]
            if winners:
                speedup, option = max(winners, key=lambda w: w[0])
                rows.append(OptionRow(collective, bucket, option, speedup, base_scores[key]))
    if not rows:
        return None
    text = table_text([r.option.row(r.collective, r.bucket, nodes=nodes, ranks=ranks) for r in rows])
    return PerSizeTable(base.number, tuple(rows), text)


def bases(trials: Sequence[StoredTrial], baseline: Measurements, objective: Objective) -> list[StoredTrial]:
    """Per rank order (the ``BASES`` best orders, best first): its best searched configuration (the baseline
    included), then its best **rescue** when that is another configuration.

    One base per order: an order that helps some sizes and hurts others is exactly what per-size rows can
    rescue, and its best environment is the one to rescue it with. A rescue is chosen by what rows could make
    of a configuration before its options are measured (``_WithRows``: channel rows give a bucket what the same
    environment measured there at a smaller channel count, and one more row may fix its weakest bucket). The
    order's best, modelled the same way, is the bar: only a configuration that would then beat it is a rescue,
    the highest such. A repeat of the best configuration is the best again, never a rescue.
    """
    eligible = [
        t
        for t in trials
        if t.role in (TrialRole.BASELINE, TrialRole.CANDIDATE, TrialRole.SAMPLED)
        and t.value is not None
        and t.measurements is not None
    ]
    by_order: dict[str, list[StoredTrial]] = {}
    for t in sorted(eligible, key=lambda t: (-(t.value or 0.0), t.number)):
        by_order.setdefault(t.rank_order, []).append(t)
    out = []
    for ranked in list(by_order.values())[:BASES]:
        best = ranked[0]
        model = _WithRows(ranked, baseline, objective)
        bar = model.value(best)
        rescues = [(model.value(t), t) for t in ranked if _config(t) != _config(best)]
        rescue = max(((v, t) for v, t in rescues if v > bar), key=lambda r: (r[0], -r[1].number), default=None)
        out += [best] if rescue is None else [best, rescue[1]]
    return out


def _config(trial: StoredTrial) -> tuple[tuple[tuple[str, str], ...], str]:
    """What a trial ran: its environment and rank order (a repeat of a configuration is the same one)."""
    return tuple(sorted(trial.env.items())), trial.rank_order


def _unforced(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """An environment without its forced channel count: what a channel row keeps of its base."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in CHANNEL_VARIABLES))


class _WithRows:
    """A configuration's weighted speedup as rows could make it, from one rank order's searched trials.

    Channel rows: each bucket as fast as the same environment with a smaller forced channel count measured
    there (a row's count above the communicator's is capped; under NCCL's own count, any forced count is
    taken as reachable). Then one more row, another algorithm or protocol: the weakest bucket (weight x log of
    its shortfall) as fast as the order's best measurement there. Optimistic: a channel row keeps the pick
    NCCL makes at the base's count, where a count in the environment can change the pick. A model for
    choosing bases, never a result: what ships is measured and proven.
    """

    def __init__(self, ranked: Sequence[StoredTrial], baseline: Measurements, objective: Objective) -> None:
        self._objective = objective
        self._scores = {t.number: _scores(t, baseline, objective) for t in ranked}
        self._ceiling: dict[tuple[str, str], float] = {}
        self._counts: dict[tuple[tuple[str, str], ...], dict[int, dict[tuple[str, str], float]]] = {}
        for t in ranked:
            count = forced_channels(t.env)
            at_count = {} if count is None else self._counts.setdefault(_unforced(t.env), {}).setdefault(count, {})
            for key, score in self._scores[t.number].items():
                self._ceiling[key] = max(self._ceiling.get(key, 0.0), score.speedup)
                at_count[key] = max(at_count.get(key, 0.0), score.speedup)

    def value(self, trial: StoredTrial) -> float:
        """The weighted speedup rows could make of one of the order's trials."""
        scores = self._scores[trial.number]
        if not scores:
            return 0.0
        cap = forced_channels(trial.env)
        smaller = [m for c, m in self._counts.get(_unforced(trial.env), {}).items() if cap is None or c < cap]
        lifted = {
            key: dataclasses.replace(s, speedup=max([s.speedup, *(m[key] for m in smaller if key in m)]))
            for key, s in scores.items()
        }

        def shortfall(key: tuple[str, str]) -> float:
            s = lifted[key]
            return self._objective.profile.weight(s.collective, s.bucket.name) * math.log(
                self._ceiling[key] / s.speedup
            )

        weakest = max(sorted(lifted), key=shortfall)
        lifted[weakest] = dataclasses.replace(lifted[weakest], speedup=self._ceiling[weakest])
        return self._objective.combine(lifted.values())


def _scores(trial: StoredTrial, baseline: Measurements, objective: Objective) -> dict[tuple[str, str], BucketScore]:
    """Per (collective, bucket name); a bucket of weight 0 counts nowhere below (its weight is 0 there too)."""
    assert trial.measurements is not None
    return {(s.collective, s.bucket.name): s for s in objective.bucket_scores(trial.measurements, baseline)}


def plan_next(
    trials: Sequence[StoredTrial],
    baseline: Measurements,
    objective: Objective,
    *,
    nodes: int,
    ranks: int,
) -> tuple[tuple[PlannedTrial, ...], bool]:
    """What to enqueue next, and whether trials of this search are still waiting or running.

    Idempotent: a trial already enqueued (any state, a stale one's retry included) is never planned again,
    and everything is recomputed from stored trials, so a resumed study plans exactly what is missing.
    Nothing more to do: ``((), False)``.
    """
    by_key = {t.key: t for t in trials if t.role in ROLES}
    pending = any(t.role in ROLES and not t.finished for t in trials)
    searched = [t for t in trials if t.role in (TrialRole.CANDIDATE, TrialRole.SAMPLED) and t.value is not None]
    planned: list[PlannedTrial] = []
    for base in bases(trials, baseline, objective):
        options = options_for(base, searched, baseline, objective)
        keys = {option: f"{TrialRole.OPTION}:{base.number}:{option.name}" for option in options}
        missing = [option for option in options if keys[option] not in by_key]
        for option in missing:
            table = option_table(option, options[option], objective, nodes=nodes, ranks=ranks)
            planned.append(PlannedTrial(TrialRole.OPTION, keys[option], base.number, base.params, table))
        composed_key = f"{TrialRole.PER_SIZE}:{base.number}"
        if missing or composed_key in by_key or any(not by_key[keys[o]].finished for o in options):
            continue
        measured = {
            option: (covered, trial.measurements)
            for option, covered in options.items()
            if (trial := by_key[keys[option]]).value is not None and trial.measurements is not None
        }
        composed = compose(base, measured, baseline, objective, nodes=nodes, ranks=ranks)
        if composed is None or any(by_key[keys[o]].table == composed.text for o in options):
            continue  # nothing won, or one option won everywhere it applies: that trial already measured it
        planned.append(PlannedTrial(TrialRole.PER_SIZE, composed_key, base.number, base.params, composed.text))
    return tuple(planned), pending
