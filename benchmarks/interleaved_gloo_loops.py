"""Time the harness's loop and a bare torch.distributed loop in the same processes, interleaved.

``python benchmarks/interleaved_gloo_loops.py RANK WORLD PORT ITERS BLOCKS SIZE...`` prints, on rank 0, one
JSON object: size -> {"harness": [busbw per block], "bare": [busbw per block]} in GB/s. The
harness side uses the worker's own op and timing code and topo-tune's busbw formula; the bare
side is a plain ``dist.all_reduce`` loop with the busbw formula written out here. Alternating
blocks within the same processes means both see the same load from anything else on the host.
"""

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

from topo_tune.agent.bench.collective_ops import make_buffers, op_for
from topo_tune.agent.bench.worker import _timed_loop
from topo_tune.benchmark.collectives import bandwidth, shape
from topo_tune.nccl.collectives import Collective


def measure(size: int, *, rank: int, world: int, iters: int, blocks: int) -> dict[str, list[float]]:
    """busbw per block for the harness side and the bare side at one size."""
    shp = shape(Collective.ALL_REDUCE, size_bytes=size, element_size=4, nranks=world)
    buffers = make_buffers(
        Collective.ALL_REDUCE, shape=shp, in_place=True, rank=rank, dtype=torch.float32, device=torch.device("cpu")
    )
    op = op_for(Collective.ALL_REDUCE, buffers, rank=rank, world_size=world)
    bare_tensor = torch.ones(size // 4)
    harness: list[float] = []
    bare: list[float] = []

    def harness_block() -> None:
        # One untimed call before each block lines the ranks up, as the harness itself does;
        # without it the first block after a switch absorbs the ranks' skew.
        op()
        seconds, _samples = _timed_loop(op, iters, cuda=False)
        harness.append(bandwidth(Collective.ALL_REDUCE, shape=shp, seconds=seconds, nranks=world)[1])

    def bare_block() -> None:
        dist.all_reduce(bare_tensor)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(bare_tensor)
        elapsed = (time.perf_counter() - start) / iters
        bare.append(size / 1e9 / elapsed * 2 * (world - 1) / world)

    for block in range(blocks):
        # Alternate which side goes first, so neither always follows the other.
        first, second = (harness_block, bare_block) if block % 2 == 0 else (bare_block, harness_block)
        first()
        second()
    return {"harness": harness, "bare": bare}


def main() -> None:
    rank, world, port, iters, blocks = (int(x) for x in sys.argv[1:6])
    sizes = [int(x) for x in sys.argv[6:]]
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    out = {size: measure(size, rank=rank, world=world, iters=iters, blocks=blocks) for size in sizes}
    dist.barrier()
    if rank == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
