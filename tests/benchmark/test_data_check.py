"""The data check: correct outputs count 0 wrong elements, one altered element counts 1.

Each collective's result is simulated here from every rank's filled inputs (a second, plain
implementation of the collective's meaning), then handed to the check.
"""

from __future__ import annotations

import pytest
import torch

from topo_tune.agent.bench.collective_ops import Buffers, fill_inputs, make_buffers, placement_supported, wrong_elements
from topo_tune.benchmark.collectives import shape
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.nccl.collectives import Collective

WORLD = 3
CPU = torch.device("cpu")


def _simulate(collective: Collective, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    n = len(inputs)
    if collective in (Collective.ALL_REDUCE, Collective.REDUCE):
        return torch.stack(inputs).sum(0)
    if collective is Collective.BROADCAST:
        return inputs[0].clone()
    if collective is Collective.ALL_GATHER:
        return torch.cat(inputs)
    if collective is Collective.REDUCE_SCATTER:
        return torch.stack(inputs).sum(0).chunk(n)[rank]
    if collective is Collective.ALLTOALL:
        return torch.cat([inputs[j].chunk(n)[rank] for j in range(n)])
    return inputs[(rank - 1) % n].clone()  # sendrecv: from the previous rank


@pytest.mark.parametrize("collective", list(Collective))
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "int8"])
def test_check_accepts_the_right_result_and_counts_a_wrong_element(collective: Collective, dtype_name: str) -> None:
    dtype = dtype_named(dtype_name)
    in_place = not placement_supported(collective, False)
    shp = shape(collective, size_bytes=4096, element_size=dtype.size, nranks=WORLD)
    buffers: list[Buffers] = []
    for rank in range(WORLD):
        b = make_buffers(
            collective, shape=shp, in_place=in_place, rank=rank, dtype=getattr(torch, dtype.name), device=CPU
        )
        fill_inputs(collective, b, rank=rank)
        buffers.append(b)
    inputs = [b.send.clone() for b in buffers]
    for rank, b in enumerate(buffers):
        b.recv.copy_(_simulate(collective, inputs, rank))
        kwargs = {"shape": shp, "rank": rank, "world_size": WORLD, "dtype": dtype}
        assert wrong_elements(collective, b, **kwargs) == 0
        b.recv.view(-1)[-1] += 1
        expected_wrong = 0 if collective is Collective.REDUCE and rank != 0 else 1
        assert wrong_elements(collective, b, **kwargs) == expected_wrong


def test_a_nan_is_wrong() -> None:
    dtype = dtype_named("float32")
    shp = shape(Collective.ALL_REDUCE, size_bytes=64, element_size=4, nranks=1)
    b = make_buffers(Collective.ALL_REDUCE, shape=shp, in_place=True, rank=0, dtype=torch.float32, device=CPU)
    fill_inputs(Collective.ALL_REDUCE, b, rank=0)
    b.recv[3] = float("nan")
    assert wrong_elements(Collective.ALL_REDUCE, b, shape=shp, rank=0, world_size=1, dtype=dtype) == 1


def test_placements_torch_can_run() -> None:
    assert not placement_supported(Collective.ALL_REDUCE, False)
    assert placement_supported(Collective.ALL_GATHER, True) and placement_supported(Collective.ALL_GATHER, False)
    assert not placement_supported(Collective.ALLTOALL, True)
