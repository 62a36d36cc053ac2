"""The size sweep of a benchmark, with nccl-tests' ``-b``/``-e``/``-f`` semantics.

nccl-tests walks ``size = min; size <= max; size *= factor``. A factor of 0 or 1 with
``min == max`` is a single size; a factor below 2 with ``min < max`` is refused (nccl-tests
would fall back to an additive step, which the wire contract does not carry). Sizes and the
largest size is bounded so that one command cannot ask an agent for absurd memory; with a
factor of at least 2 that also bounds the number of steps (at most 35).

Non-goals: how a size maps to element counts (``collectives``).
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.errors import SweepError

__all__ = ["MAX_BYTES_LIMIT", "SizeSweep", "SweepError", "size_ladder"]

MAX_BYTES_LIMIT = 16 * 1024**3
"""Largest size one step may ask for (16 GiB, beyond nccl-tests' usual 8 GB tops)."""


@dataclass(frozen=True, slots=True)
class SizeSweep:
    """``min_bytes`` (-b), ``max_bytes`` (-e) and ``step_factor`` (-f)."""

    min_bytes: int
    max_bytes: int
    step_factor: int = 2

    def __post_init__(self) -> None:
        if self.min_bytes < 1:
            raise SweepError(f"sizes.min_bytes must be >= 1, got {self.min_bytes}")
        if self.max_bytes < self.min_bytes:
            raise SweepError(f"sizes.max_bytes ({self.max_bytes}) is below sizes.min_bytes ({self.min_bytes})")
        if self.max_bytes > MAX_BYTES_LIMIT:
            raise SweepError(f"sizes.max_bytes must be <= {MAX_BYTES_LIMIT}, got {self.max_bytes}")
        if self.step_factor < 2 and self.max_bytes != self.min_bytes:
            raise SweepError(f"sizes.step_factor must be >= 2 when min_bytes < max_bytes, got {self.step_factor}")

    def sizes(self) -> tuple[int, ...]:
        """Requested sizes in bytes, smallest first."""
        return size_ladder(min_bytes=self.min_bytes, max_bytes=self.max_bytes, step_factor=self.step_factor)


def size_ladder(*, min_bytes: int, max_bytes: int, step_factor: int) -> tuple[int, ...]:
    """The sizes nccl-tests walks for ``-b min -e max -f factor``, smallest first.

    A factor below 2 gives ``min_bytes`` alone; a ``max_bytes`` below ``min_bytes`` gives no size at all.
    Raises ``SweepError`` on a ``min_bytes`` below 1 (the walk would never end).
    """
    if min_bytes < 1:
        raise SweepError(f"min_bytes must be >= 1, got {min_bytes}")
    ladder = []
    size = min_bytes
    while size <= max_bytes:
        ladder.append(size)
        if step_factor < 2:
            break
        size *= step_factor
    return tuple(ladder)
