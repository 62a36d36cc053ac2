"""The collectives topo-tune benchmarks and their nccl-tests arithmetic.

Every number here follows NVIDIA nccl-tests (``src/*.cu``: ``*GetCollByteCount`` and
``*GetBw``) so that a topo-tune figure can be compared with an ``*_perf`` run line by line:

- a requested size ``S`` becomes ``count = S // element_size`` elements; each collective then
  derives its send/receive/parameter counts from it (all_gather, reduce_scatter and alltoall
  round the per-rank part down to 16 bytes, as nccl-tests does);
- the reported size is ``max(send bytes, receive bytes)`` and the reported count is the
  parameter count handed to the collective;
- algbw = bytes moved per rank buffer / time, busbw = algbw × the collective's bus factor.

Non-goals: running anything (see ``topo_tune.agent.bench``) or choosing sizes (``sweep``).
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.nccl.collectives import Collective

__all__ = ["CollectiveShape", "bandwidth", "bus_factor", "shape"]

_ALIGN_BYTES = 16


@dataclass(frozen=True, slots=True)
class CollectiveShape:
    """Element counts of one size step, as nccl-tests' ``setupArgs`` computes them."""

    send_count: int
    recv_count: int
    param_count: int
    element_size: int

    @property
    def reported_bytes(self) -> int:
        """The ``size (B)`` column: max of the send and receive buffers."""
        return max(self.send_count, self.recv_count) * self.element_size

    @property
    def param_bytes(self) -> int:
        return self.param_count * self.element_size


def _aligned_part(count: int, *, nranks: int, element_size: int) -> int:
    # nccl-tests: (count/nranks) & -(16/eltSize), i.e. round down to 16-byte multiples.
    per_rank = count // nranks
    step = max(1, _ALIGN_BYTES // element_size)
    return per_rank - per_rank % step


def shape(collective: Collective, *, size_bytes: int, element_size: int, nranks: int) -> CollectiveShape:
    """Counts for one requested size; raises ``ValueError`` on a non-positive rank count."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    if element_size < 1:
        raise ValueError(f"element_size must be >= 1, got {element_size}")
    count = size_bytes // element_size
    if collective is Collective.ALL_GATHER:
        base = _aligned_part(count, nranks=nranks, element_size=element_size)
        return CollectiveShape(base, base * nranks, base, element_size)
    if collective is Collective.REDUCE_SCATTER:
        base = _aligned_part(count, nranks=nranks, element_size=element_size)
        return CollectiveShape(base * nranks, base, base, element_size)
    if collective is Collective.ALLTOALL:
        part = _aligned_part(count, nranks=nranks, element_size=element_size)
        return CollectiveShape(part * nranks, part * nranks, part, element_size)
    # all_reduce, broadcast, reduce, sendrecv: one buffer of `count` elements.
    return CollectiveShape(count, count, count, element_size)


_BUS_FACTOR_KIND = {
    Collective.ALL_REDUCE: "allreduce",
    Collective.ALL_GATHER: "gather",
    Collective.REDUCE_SCATTER: "gather",
    Collective.ALLTOALL: "gather",
    Collective.BROADCAST: "one",
    Collective.REDUCE: "one",
    Collective.SENDRECV: "one",
}


def bus_factor(collective: Collective, nranks: int) -> float:
    """busbw / algbw: 2(n-1)/n for all_reduce, (n-1)/n for gathers/scatters/alltoall, else 1."""
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, got {nranks}")
    kind = _BUS_FACTOR_KIND[collective]
    if kind == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if kind == "gather":
        return (nranks - 1) / nranks
    return 1.0


def bandwidth(collective: Collective, *, shape: CollectiveShape, seconds: float, nranks: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes) for one iteration time, as nccl-tests prints them."""
    if seconds <= 0:
        return 0.0, 0.0
    if collective in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALLTOALL):
        moved = shape.param_bytes * nranks
    else:
        moved = shape.param_bytes
    algbw = moved / 1.0e9 / seconds
    return algbw, algbw * bus_factor(collective, nranks)
