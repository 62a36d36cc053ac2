"""The tuner plugin's table as Python reads it: the same CSV rules as ``topotune_tuner.c``, but strict.

The plugin skips a malformed line with a WARN (one bad line must not stop a running job). Before a table is
handed to a job (a benchmark trial's candidate table, a config version's ``nccl_tuner.conf``) topo-tune
checks it with :func:`parse_tuner_table`, which refuses the whole table at the first malformed line and
names the line and the field, with the plugin's own wording. :meth:`TunerRow.applies` is the plugin's
matching rule for one call, for the ``sim`` backend that plays NCCL's part.

Non-goals: NCCL's cost model (whether NCCL allows a row's algorithm/protocol is NCCL's business) and
writing tables (the tuner renders them).
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.errors import TunerTableError
from topo_tune.nccl.collectives import PLUGIN_COLLECTIVES

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "KEEP_NCCLS",
    "MAX_TABLE_BYTES",
    "PROTOCOLS",
    "TunerRow",
    "TunerTableError",
    "parse_tuner_table",
]

COLLECTIVES = PLUGIN_COLLECTIVES
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
KEEP_NCCLS = "-1"
"""Algorithm and protocol both ``-1``: NCCL keeps its choice, the row only sets the channel count."""
MAX_TABLE_BYTES = 64 * 1024
"""A benchmark job's table travels in every rank's command; a real table is a few rows per collective."""

_FIELDS_MIN, _FIELDS_MAX = 8, 10
_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1
_HEADER = "collective_type,"


@dataclass(frozen=True, slots=True)
class TunerRow:
    """One validated row; ``None`` where the table says -1 ("any", or "keep NCCL's")."""

    line: int
    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str | None
    protocol: str | None
    channels: int | None
    n_nodes: int | None
    n_ranks: int | None
    num_pipe_ops: int | None = None
    reg_buff: int | None = None

    def fits(self, *, n_nodes: int, n_ranks: int) -> bool:
        """Whether the plugin binds this row to a communicator of that shape (at its init)."""
        return (self.n_nodes is None or self.n_nodes == n_nodes) and (self.n_ranks is None or self.n_ranks == n_ranks)

    def applies(self, collective: str, n_bytes: int) -> bool:
        """Whether a call of one collective, not aggregated and with unregistered buffers, matches the row."""
        return (
            self.collective == collective
            and self.min_bytes <= n_bytes <= self.max_bytes
            and self.num_pipe_ops in (None, 1)
            and self.reg_buff in (None, 0)
        )


def parse_tuner_table(text: str, *, source: str = "tuner_table") -> tuple[TunerRow, ...]:
    """Every data row of ``text`` in file order (comments, blank lines and the header skipped).

    Raises:
        TunerTableError: the table is too large, or a line is malformed; ``source:LINE: field ...``.
    """
    size = len(text.encode())
    if size > MAX_TABLE_BYTES:
        raise TunerTableError(source, 0, f"the table is {size} bytes, more than the {MAX_TABLE_BYTES} allowed")
    rows = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith(_HEADER):
            continue
        try:
            rows.append(_row(number, [f.strip() for f in line.split(",")]))
        except ValueError as exc:
            raise TunerTableError(source, number, str(exc)) from None
    return tuple(rows)


def _row(number: int, fields: list[str]) -> TunerRow:
    if not _FIELDS_MIN <= len(fields) <= _FIELDS_MAX:
        raise ValueError(f"expected {_FIELDS_MIN} to {_FIELDS_MAX} comma-separated fields, got {len(fields)}")
    collective, algorithm, protocol = (f.lower() for f in (fields[0], fields[3], fields[4]))
    if collective not in COLLECTIVES:
        raise ValueError(f"collective_type '{fields[0]}' is not one of {', '.join(COLLECTIVES)}")
    min_bytes = _bytes("min_bytes", fields[1])
    max_bytes = _bytes("max_bytes", fields[2])
    if max_bytes < min_bytes:
        raise ValueError(f"max_bytes {max_bytes} is below min_bytes {min_bytes}")
    if KEEP_NCCLS in (algorithm, protocol):
        if algorithm != protocol:
            raise ValueError(
                f"algorithm '{fields[3]}' and protocol '{fields[4]}': -1 (keep NCCL's) must be given for both"
            )
    elif algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm '{fields[3]}' is not one of {', '.join(ALGORITHMS)}")
    elif protocol not in PROTOCOLS:
        raise ValueError(f"protocol '{fields[4]}' is not one of {', '.join(PROTOCOLS)}")
    keep = algorithm == KEEP_NCCLS
    return TunerRow(
        line=number,
        collective=collective,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        algorithm=None if keep else algorithm,
        protocol=None if keep else protocol,
        channels=_key("channels", fields[5], low=1, high=_INT32_MAX),
        n_nodes=_key("nNodes", fields[6], low=1, high=_INT32_MAX),
        n_ranks=_key("nRanks", fields[7], low=1, high=_INT32_MAX),
        num_pipe_ops=_key("numPipeOps", fields[8], low=1, high=_INT32_MAX) if len(fields) > 8 else None,
        reg_buff=_key("regBuff", fields[9], low=0, high=1) if len(fields) > 9 else None,
    )


def _bytes(name: str, text: str) -> int:
    # Decimal digits only, as the plugin's strtoull guard: no sign, no suffix, no spaces inside.
    if not text.isascii() or not text.isdigit() or int(text) > _UINT64_MAX:
        raise ValueError(f"{name} '{text}' is not a non-negative integer")
    return int(text)


def _key(name: str, text: str, *, low: int, high: int) -> int | None:
    digits = text[1:] if text.startswith("-") else text
    value = int(text) if digits.isascii() and digits.isdigit() else None
    if value == -1:
        return None
    if value is None or not low <= value <= high:
        if low == 0:
            raise ValueError(f"{name} '{text}' is not -1, 0 or 1")
        raise ValueError(f"{name} '{text}' is neither -1 nor a positive integer")
    return value
