"""Compose a candidate tuner-plugin table from a study's per-bucket winners.

Purpose: an environment variable sets one channel count for every message size, but the best count differs
by size (on 2×H200, 16 CTAs win at 32 KB and lose at 512 MB). Only the tuner plugin can hand NCCL a choice
per size. After the search, for every (collective, size bucket) the plugin can tune, the trial that did best
in that bucket is its winner; where the winner forced a channel count (``NCCL_MIN_CTAS = NCCL_MAX_CTAS``)
that differs from the overall best trial's, a row asks for the winner's count in that bucket's sizes. The
candidate is the best trial's configuration plus those rows. It is only a candidate: the study measures it
like any trial, and it becomes the result only by winning its interleaved proof against the defaults, so
what is promoted is exactly the table that was measured.

Rows keep NCCL's algorithm and protocol (``-1,-1``): the ``nccl`` backend does not report NCCL's choice, and
a channel count is what the winners differ in. They are keyed by the job's communicator (nNodes, nRanks) so
that other communicators of the same job keep NCCL's choices. NCCL caps a row's channel count at the
communicator's own, which the base trial's settings fix.

Non-goals: measuring (the study does), and per-size threads or buffer sizes (no tuner can set those).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topo_tune.nccl.collectives import Collective
from topo_tune.tuner.objective import Measurements, Objective, SizeBucket

__all__ = ["CHANNEL_VARIABLES", "TABLE_HEADER", "ChannelRow", "ComposedTable", "ScoredTrial", "compose_table"]

TABLE_HEADER = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"
PLUGIN_COLLECTIVES: Mapping[str, str] = {c.value: c.plugin_name for c in Collective if c.plugin_name is not None}
"""nccl-tests names -> the tuner plugin's (from the one enum); point-to-point collectives never reach a tuner."""


@dataclass(frozen=True)
class ScoredTrial:
    """A completed search trial, as the composition needs it."""

    number: int
    env: Mapping[str, str]
    value: float
    measurements: Measurements


@dataclass(frozen=True)
class ChannelRow:
    collective: str
    bucket: SizeBucket
    channels: int
    winner: int
    """The trial whose channel count won this bucket."""
    speedup: float
    """The winner's speedup over the baseline in this bucket, during the search."""


@dataclass(frozen=True)
class ComposedTable:
    base_trial: int
    """The best trial of the search: the candidate runs its configuration (channels raised, see below) and the table."""
    env: Mapping[str, str]
    """The candidate's variables: the best trial's, with the channel count raised to the largest any row asks
    for, since NCCL caps a row's count at the communicator's."""
    rows: tuple[ChannelRow, ...]
    text: str
    """The table as the plugin reads it."""


CHANNEL_VARIABLES = ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS")
"""The variables a configuration forces its channel count with (both set to the count)."""


def forced_channels(env: Mapping[str, str]) -> int | None:
    """The channel count a configuration forces (``NCCL_MIN_CTAS`` equal to ``NCCL_MAX_CTAS``), if any."""
    low, high = (env.get(name) for name in CHANNEL_VARIABLES)
    if low is None or low != high or not low.isdigit():
        return None
    return int(low)


def compose_table(
    trials: Sequence[ScoredTrial],
    baseline: Measurements,
    objective: Objective,
    *,
    nodes: int,
    ranks: int,
) -> ComposedTable | None:
    """The best trial plus per-bucket channel rows, or None when no bucket wants a count of its own.

    A bucket wants its winner's forced count when the winner beat the baseline there and the workload weighs
    the bucket; otherwise (the defaults won, the winner left channels to NCCL, or the bucket has weight 0) it
    keeps the best trial's. When the best trial forces a count,
    the candidate forces the largest wanted one instead and every bucket that wants another gets a row; when
    it leaves channels to NCCL, NCCL's own count stays the cap and rows can only ask for fewer or as many.
    """
    if not trials:
        return None
    best = max(trials, key=lambda t: (t.value, -t.number))
    base_channels = forced_channels(best.env)
    winners: dict[tuple[str, str], tuple[float, ScoredTrial]] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        for score in objective.bucket_scores(trial.measurements, baseline):
            key = (score.collective, score.bucket.name)
            if score.collective in PLUGIN_COLLECTIVES and (key not in winners or score.speedup > winners[key][0]):
                winners[key] = (score.speedup, trial)
    wanted: dict[tuple[str, SizeBucket], tuple[int | None, int, float]] = {}
    for collective in (c for c in objective.collectives if c in PLUGIN_COLLECTIVES):
        for bucket in objective.buckets:
            speedup, winner = winners.get((collective, bucket.name), (1.0, best))
            # A bucket the workload does not weigh has no say: its "winner" is whatever noise picked.
            weighted = objective.profile.weight(collective, bucket.name) > 0
            channels = forced_channels(winner.env) if speedup > 1.0 and weighted else None
            if channels is None:
                winner, channels = best, base_channels
            wanted[collective, bucket] = (channels, winner.number, speedup)
    counts = {c for c, _, _ in wanted.values() if c is not None}
    communicator = max(counts) if base_channels is not None and counts else base_channels
    rows = tuple(
        ChannelRow(collective, bucket, channels, winner, speedup)
        for (collective, bucket), (channels, winner, speedup) in wanted.items()
        if channels is not None and channels != communicator
    )
    if not rows:
        return None
    env = dict(best.env)
    if communicator is not None:
        env.update(NCCL_MIN_CTAS=str(communicator), NCCL_MAX_CTAS=str(communicator))
    lines = [f"# {TABLE_HEADER}"]
    lines += [
        f"{PLUGIN_COLLECTIVES[r.collective]},{r.bucket.min_bytes},{r.bucket.max_bytes},-1,-1,{r.channels},{nodes},{ranks}"
        for r in rows
    ]
    return ComposedTable(base_trial=best.number, env=env, rows=rows, text="\n".join(lines) + "\n")
