"""The tuner plugin's record of NCCL's choices, as Python reads it.

With ``TOPOTUNE_TUNER_RECORD`` naming a file, ``topotune_tuner.c`` appends one line per distinct call of each
communicator: the (algorithm, protocol) entries NCCL offered for it (cost not ``-1``), the one NCCL would
have picked, the one that ran after the table (``applied``), and the channel count the table set. The
``nccl`` benchmark worker reads it to report, with every size, what NCCL offered and chose; the per-size
search composes rows only from offered entries.

Entries are spelled ``algorithm/protocol`` in the plugin's (and the table's) names: ``ring/ll128``.

Non-goals: writing the record (the plugin does) and deciding anything from it (the tuner does).
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.errors import RecordError

__all__ = ["RECORD_ENV", "RecordError", "RecordedCall", "parse_record"]

RECORD_ENV = "TOPOTUNE_TUNER_RECORD"
"""The variable naming the file the plugin appends its record to."""

_HEADER = "collective,bytes,numPipeOps,regBuff,nNodes,nRanks,nccl,applied,channels,offered"
_FIELDS = len(_HEADER.split(","))
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""A record larger than this is refused: the plugin writes a few dozen short lines per benchmark."""


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One recorded call: what NCCL offered and chose, and what ran."""

    collective: str
    """The plugin's name: allreduce, allgather, reducescatter, broadcast, reduce."""
    bytes: int
    num_pipe_ops: int
    reg_buff: int
    n_nodes: int
    n_ranks: int
    nccl: str
    """NCCL's own pick, ``algorithm/protocol`` (``none`` when it offered nothing)."""
    applied: str
    """What ran after the table: NCCL's pick where no row applied."""
    channels: int | None
    """The channel count the table set; None: NCCL's."""
    offered: tuple[str, ...]


def parse_record(text: str, *, source: str = "record") -> tuple[RecordedCall, ...]:
    """Every call of ``text`` in file order (header lines skipped).

    Raises:
        RecordError: the record is too large or a line is malformed (``source:LINE: why``).
    """
    if len(text) > MAX_RECORD_BYTES:
        raise RecordError(f"{source}: {len(text)} bytes, more than the {MAX_RECORD_BYTES} a record may hold")
    calls = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line == _HEADER:
            continue
        fields = line.split(",")
        if len(fields) != _FIELDS:
            raise RecordError(f"{source}:{number}: expected {_FIELDS} comma-separated fields, got {len(fields)}")
        try:
            collective, size, pipe, reg, nodes, ranks = fields[0], *(int(f) for f in fields[1:6])
            channels = int(fields[8])
        except ValueError:
            raise RecordError(
                f"{source}:{number}: bytes, numPipeOps, regBuff, nNodes, nRanks and channels must be integers"
            ) from None
        calls.append(
            RecordedCall(
                collective=collective,
                bytes=size,
                num_pipe_ops=pipe,
                reg_buff=reg,
                n_nodes=nodes,
                n_ranks=ranks,
                nccl=fields[6],
                applied=fields[7],
                channels=channels if channels > 0 else None,
                offered=tuple(fields[9].split()),
            )
        )
    return tuple(calls)
