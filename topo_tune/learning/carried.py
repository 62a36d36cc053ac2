"""The challenger tables a config version carries: from a pass's finalists, those ``candidates`` admits.

When a pass creates a version and learning is on, every finalist of its proof other than the chosen one (the
named trade-off included) is judged by ``candidates.admit_challenger``; the admitted ones become the version's
``nccl_tuner.challenger-N.conf`` files (best proven speedup first, at most ``MAX_CHALLENGERS``, no table twice),
and each refused one is named with its first reason in the provenance (``learning.refused.trial-T``), which
travels beside the files, outside the content id. A version with no challenger has exactly the files it had
before learning existed, so its id is unchanged.

Non-goals: the rule itself (``candidates``), writing outputs (``tuner.outputs``), choosing arms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from topo_tune.learning.candidates import admit_challenger
from topo_tune.tuner.proof import FinalistProof
from topo_tune.versions.version import MAX_CHALLENGERS, challenger_table

__all__ = ["CHALLENGER_KEY", "REFUSED_KEY", "Carried", "carried_challengers"]

CHALLENGER_KEY = "learning.challenger."
"""Provenance key prefix: ``learning.challenger.N`` says which trial challenger N is and which buckets it changes."""
REFUSED_KEY = "learning.refused.trial-"
"""Provenance key prefix: ``learning.refused.trial-T`` says why finalist T is not carried (its first reason)."""
_MAX_NOTE = 256  # a provenance value's limit (the controller's label values)
_MAX_REFUSED = 8  # provenance holds at most 64 labels: the rest are counted, not named


@dataclass(frozen=True, slots=True)
class Carried:
    """What a version carries for learning: challenger files, and provenance naming them and the refused."""

    files: dict[str, str] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)


def _note(text: str) -> str:
    return text if len(text) <= _MAX_NOTE else text[: _MAX_NOTE - 3] + "..."


def carried_challengers(
    chosen: FinalistProof | None, finalists: Sequence[FinalistProof], *, shipped_table: str, max_loss: float
) -> Carried:
    """The challengers a version whose chosen finalist is ``chosen`` and whose ``nccl_tuner.conf`` is
    ``shipped_table`` carries; ``finalists`` are the proof's (the chosen one and duplicates are skipped)."""
    if chosen is None:
        return Carried()  # NCCL's defaults: no table to explore beside
    others = {p.trial: p for p in finalists if p.trial != chosen.trial}
    ranked = sorted(others.values(), key=lambda p: (-p.speedup, p.trial))
    provenance: dict[str, str] = {}
    files: dict[str, str] = {}
    refused: list[tuple[int, str]] = []
    for proof in ranked:
        if shipped_table != chosen.config.tuner_table:
            refused.append((proof.trial, "the chosen table was derived from promoted buckets, not proven as a table"))
            continue
        admission = admit_challenger(chosen, proof, max_loss=max_loss)
        if not admission.admitted:
            more = f" (+{len(admission.refusals) - 1} more)" if len(admission.refusals) > 1 else ""
            refused.append((proof.trial, admission.refusals[0] + more))
        elif proof.config.tuner_table in files.values():
            refused.append((proof.trial, "its table is one carried already"))
        elif len(files) == MAX_CHALLENGERS:
            refused.append((proof.trial, f"a version carries at most {MAX_CHALLENGERS} challengers"))
        else:
            name = challenger_table(len(files) + 1)
            files[name] = proof.config.tuner_table
            changes = ", ".join(f"{c} {b}" for c, b in admission.changed)
            provenance[f"{CHALLENGER_KEY}{len(files)}"] = _note(f"trial {proof.trial}: changes {changes}")
    for trial, why in refused[:_MAX_REFUSED]:
        provenance[f"{REFUSED_KEY}{trial}"] = _note(why)
    if len(refused) > _MAX_REFUSED:
        provenance[f"{REFUSED_KEY}more"] = f"{len(refused) - _MAX_REFUSED} more finalists refused"
    return Carried(files, provenance)
