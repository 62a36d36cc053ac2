"""Which challenger per-size tables a config version may carry beside its chosen one.

A challenger is a finalist of the same proof (the named trade-off included) that differs from the chosen
finalist only in its tuner-plugin table. It may be carried only when, in every (collective, size bucket)
where its table changes what the chosen table does:

* the proof showed it safe against NCCL's defaults (``faster`` or ``no difference shown``: its lower bound
  is at least ``1 - maxLoss``), and
* its lower bound over the chosen finalist's upper bound, both against the same baseline, is at least
  ``1 - maxLoss``: so a job that runs it, rather than the chosen table, loses at most the proof's loss
  margin there (both bounds hold together with probability at least ``1 - 2 alpha``).

Where the two tables agree the job runs exactly what the chosen one runs, so no evidence is needed. "Changes"
is judged conservatively: the rows that reach into a bucket, cut to the bucket and without their line
numbers, must be the same rows in the same order, or the bucket counts as changed (rows that differ but
choose alike cost evidence, never safety). A change at sizes outside every bucket is refused: the proof
measured nothing there.

Non-goals: running the proof (``tuner.proof``), storing what a version carries, assigning jobs to arms
(``assignment``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topo_tune.ids import BucketName
from topo_tune.plugin.table import TunerRow, parse_tuner_table
from topo_tune.tuner.objective import SizeBucket
from topo_tune.tuner.plugin_table import PLUGIN_COLLECTIVES
from topo_tune.tuner.proof import BucketProof, FinalistProof

__all__ = ["Admission", "admit_challenger", "changed_buckets"]

_MAX_BYTES = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict on one challenger: carried only when ``refusals`` is empty."""

    challenger: int
    """The challenger's trial number."""
    changed: tuple[tuple[str, BucketName], ...]
    """(plugin collective, bucket name) where its table changes the chosen table's choice."""
    refusals: tuple[str, ...]
    """One line per reason it may not be carried, naming the bucket."""

    @property
    def admitted(self) -> bool:
        return not self.refusals


def _clipped(rows: Sequence[TunerRow], collective: str, low: int, high: int) -> tuple[tuple[object, ...], ...]:
    """The rows of one collective that reach into [low, high], cut to it, as comparable values."""
    return tuple(
        (
            max(r.min_bytes, low),
            min(r.max_bytes, high),
            r.algorithm,
            r.protocol,
            r.channels,
            r.n_nodes,
            r.n_ranks,
            r.num_pipe_ops,
            r.reg_buff,
        )
        for r in rows
        if r.collective == collective and r.min_bytes <= high and r.max_bytes >= low
    )


def _gaps(buckets: Sequence[SizeBucket]) -> list[tuple[int, int]]:
    """The byte ranges no bucket holds."""
    gaps, start = [], 0
    for bucket in sorted(buckets, key=lambda b: b.min_bytes):
        if bucket.min_bytes > start:
            gaps.append((start, bucket.min_bytes - 1))
        start = max(start, bucket.max_bytes + 1)
    if start <= _MAX_BYTES:
        gaps.append((start, _MAX_BYTES))
    return gaps


def changed_buckets(
    chosen_table: str, challenger_table: str, *, buckets: Sequence[SizeBucket]
) -> tuple[list[tuple[str, BucketName]], list[str]]:
    """Where the challenger's table changes the chosen one's: (collective, bucket name) pairs, and the byte
    ranges outside every bucket where it does (each as ``collective min-max``).

    Raises:
        TunerTableError: either table is malformed.
    """
    chosen = parse_tuner_table(chosen_table, source="chosen table")
    challenger = parse_tuner_table(challenger_table, source="challenger table")
    collectives = sorted({r.collective for r in (*chosen, *challenger)})
    changed = [
        (c, b.name)
        for c in collectives
        for b in buckets
        if _clipped(chosen, c, b.min_bytes, b.max_bytes) != _clipped(challenger, c, b.min_bytes, b.max_bytes)
    ]
    outside = [
        f"{c} {low}-{high}"
        for c in collectives
        for low, high in _gaps(buckets)
        if _clipped(chosen, c, low, high) != _clipped(challenger, c, low, high)
    ]
    return changed, outside


def _proof_of(proof: FinalistProof, collective: str, bucket: BucketName) -> BucketProof | None:
    for b in proof.buckets:
        if PLUGIN_COLLECTIVES.get(b.collective) == collective and b.bucket.name == bucket and b.weight > 0:
            return b
    return None


def _bucket_refusal(
    chosen: BucketProof | None, challenger: BucketProof | None, *, where: str, max_loss: float
) -> str | None:
    if challenger is None:
        return f"{where}: its table changes this bucket, but the proof did not test it (a bucket weighed 0)"
    if not challenger.decision.safe:
        return f"{where}: {challenger.decision.value} against NCCL's defaults ({challenger.text})"
    if chosen is None:
        return f"{where}: the chosen finalist has no proof of this bucket to compare with"
    relative = challenger.ci_low / chosen.ci_high
    if relative < 1.0 - max_loss:
        return (
            f"{where}: may lose {1.0 - relative:.1%} against the chosen table "
            f"(its lower bound {challenger.ci_low:.3f} over the chosen one's upper bound {chosen.ci_high:.3f}), "
            f"more than maxLoss {max_loss:.1%}"
        )
    return None


def admit_challenger(chosen: FinalistProof, challenger: FinalistProof, *, max_loss: float) -> Admission:
    """Whether ``challenger`` may be carried beside ``chosen``, and why not when it may not.

    ``max_loss`` is the proof's own (``search.maxLoss``), the loss margin exploring may cost per bucket.
    """
    refusals: list[str] = []
    if challenger.failure is not None:
        refusals.append(f"its proof failed: {challenger.failure}")
    if challenger.config.env != chosen.config.env or challenger.config.rank_order != chosen.config.rank_order:
        refusals.append("its environment or rank order differs from the chosen one's: an arm swaps only the table")
    buckets = list({b.bucket.name: b.bucket for b in (*chosen.buckets, *challenger.buckets)}.values())
    changed, outside = changed_buckets(chosen.config.tuner_table, challenger.config.tuner_table, buckets=buckets)
    refusals += [f"{where}: its table changes sizes outside every bucket the proof measured" for where in outside]
    for collective, bucket in changed:
        refusal = _bucket_refusal(
            _proof_of(chosen, collective, bucket),
            _proof_of(challenger, collective, bucket),
            where=f"{collective} {bucket}",
            max_loss=max_loss,
        )
        if refusal is not None:
            refusals.append(refusal)
    if not changed and not outside:
        refusals.append("its table chooses exactly as the chosen one does: nothing to learn")
    return Admission(challenger=challenger.trial, changed=tuple(changed), refusals=tuple(refusals))
