"""Buffers, one call of each collective, and the data check, on torch.distributed.

Layouts follow nccl-tests: an in-place all_gather sends from its own slice of the output, an
in-place reduce_scatter receives into its own slice of the input. torch.distributed runs
all_reduce, broadcast and reduce in place only (it has no separate output buffer for them), and
nccl-tests itself does not check in-place alltoall; ``placement_supported`` says what runs.

Data check (nccl-tests ``-c 1``): after the timed loops the inputs are refilled with
``pattern(rank, i) = (rank + i) % 3 + 1``, the collective runs once, and every element of this
rank's output is compared with the value computed from the pattern. Sums of small integers are
exact in every dtype up to its exact-integer limit; past it (16-bit floats on big worlds) a
relative tolerance of ``ceil(log2(n)) / limit`` absorbs rounding from the order of summation.

Non-goals: timing (``worker``), the wire (``topo_tune.wire.benchmark``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from topo_tune.benchmark.collectives import CollectiveShape
from topo_tune.benchmark.dtypes import DType
from topo_tune.nccl.collectives import Collective

__all__ = ["Buffers", "make_buffers", "op_for", "placement_supported", "wrong_elements"]

_PATTERN_PERIOD = 3

# torch 2.13 renamed these; older torch (2.11 on some hosts) only has the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_IN_PLACE_ONLY = frozenset({Collective.ALL_REDUCE, Collective.BROADCAST, Collective.REDUCE})


def placement_supported(collective: Collective, in_place: bool) -> bool:
    if collective in _IN_PLACE_ONLY:
        return in_place
    if not collective.checks_in_place:
        return not in_place
    return True


@dataclass(frozen=True, slots=True)
class Buffers:
    send: torch.Tensor
    """What this rank contributes (a view into ``recv`` when in place)."""
    recv: torch.Tensor
    """What this rank receives (a view into ``send``'s storage when in place)."""


def make_buffers(
    collective: Collective,
    *,
    shape: CollectiveShape,
    in_place: bool,
    rank: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Buffers:
    send_n, recv_n = shape.send_count, shape.recv_count
    if not in_place:
        return Buffers(
            send=torch.zeros(send_n, dtype=dtype, device=device),
            recv=torch.zeros(recv_n, dtype=dtype, device=device),
        )
    if collective is Collective.ALL_GATHER:
        recv = torch.zeros(recv_n, dtype=dtype, device=device)
        return Buffers(send=recv[rank * send_n : (rank + 1) * send_n], recv=recv)
    if collective is Collective.REDUCE_SCATTER:
        send = torch.zeros(send_n, dtype=dtype, device=device)
        return Buffers(send=send, recv=send[rank * recv_n : (rank + 1) * recv_n])
    buf = torch.zeros(send_n, dtype=dtype, device=device)
    return Buffers(send=buf, recv=buf)


def op_for(collective: Collective, buffers: Buffers, *, rank: int, world_size: int) -> Callable[[], None]:
    """A no-argument callable that issues the collective once (asynchronously on GPU streams)."""
    send, recv = buffers.send, buffers.recv
    if collective is Collective.ALL_REDUCE:
        return lambda: dist.all_reduce(recv)
    if collective is Collective.ALL_GATHER:
        return lambda: _all_gather(recv, send)
    if collective is Collective.REDUCE_SCATTER:
        return lambda: _reduce_scatter(recv, send)
    if collective is Collective.BROADCAST:
        return lambda: dist.broadcast(recv, src=0)
    if collective is Collective.REDUCE:
        return lambda: dist.reduce(recv, dst=0)
    if collective is Collective.ALLTOALL:
        return lambda: dist.all_to_all_single(recv, send)
    if collective is Collective.SENDRECV:
        nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size

        def sendrecv() -> None:
            # Grouped like nccl-tests' ncclGroupStart/End, so a ring of sends cannot deadlock.
            ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prev)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return sendrecv
    raise ValueError(f"unknown collective {collective}")


def _pattern(rank: int, index: torch.Tensor) -> torch.Tensor:
    return (index + rank) % _PATTERN_PERIOD + 1


def _pattern_sum(index: torch.Tensor, world_size: int) -> torch.Tensor:
    """sum over ranks j < world_size of pattern(j, index), in closed form."""
    cycles, rest = divmod(world_size, _PATTERN_PERIOD)
    total = torch.full_like(index, world_size + cycles * (0 + 1 + 2))
    for t in range(rest):
        total += (index + t) % _PATTERN_PERIOD
    return total


def fill_inputs(collective: Collective, buffers: Buffers, *, rank: int) -> None:
    """Refill this rank's inputs with the check pattern and zero its outputs."""
    buffers.recv.zero_()
    if collective is Collective.BROADCAST and rank != 0:
        return
    index = torch.arange(buffers.send.numel(), device=buffers.send.device)
    buffers.send.copy_(_pattern(rank, index).to(buffers.send.dtype))


def _expected(
    collective: Collective, *, shape: CollectiveShape, rank: int, world_size: int, device: torch.device
) -> torch.Tensor | None:
    n, part = world_size, shape.param_count
    if collective in (Collective.ALL_REDUCE, Collective.REDUCE):
        if collective is Collective.REDUCE and rank != 0:
            return None  # nccl-tests checks only the root of a reduce
        return _pattern_sum(torch.arange(shape.recv_count, device=device), n)
    if collective is Collective.BROADCAST:
        return _pattern(0, torch.arange(shape.recv_count, device=device))
    if collective is Collective.ALL_GATHER:
        index = torch.arange(part, device=device)
        return torch.cat([_pattern(j, index) for j in range(n)])
    if collective is Collective.REDUCE_SCATTER:
        return _pattern_sum(torch.arange(rank * part, (rank + 1) * part, device=device), n)
    if collective is Collective.ALLTOALL:
        index = torch.arange(rank * part, (rank + 1) * part, device=device)
        return torch.cat([_pattern(j, index) for j in range(n)])
    if collective is Collective.SENDRECV:
        return _pattern((rank - 1) % n, torch.arange(shape.recv_count, device=device))
    raise ValueError(f"unknown collective {collective}")


def wrong_elements(
    collective: Collective,
    buffers: Buffers,
    *,
    shape: CollectiveShape,
    rank: int,
    world_size: int,
    dtype: DType,
) -> int:
    """Elements of this rank's output that differ from the expected result."""
    expected = _expected(collective, shape=shape, rank=rank, world_size=world_size, device=buffers.recv.device)
    if expected is None:
        return 0
    got = buffers.recv
    if not dtype.is_float:
        return int((got != expected.to(got.dtype)).sum().item())
    want = expected.to(torch.float64)
    diff = (got.to(torch.float64) - want).abs()
    largest = _PATTERN_PERIOD * world_size
    tolerance = (
        0.0 if largest <= dtype.exact_integer_limit else math.ceil(math.log2(world_size)) / dtype.exact_integer_limit
    )
    # `~(diff <= tol)` also counts NaN as wrong.
    return int((~(diff <= want.abs() * tolerance)).sum().item())
