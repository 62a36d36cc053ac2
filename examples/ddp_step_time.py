"""A small PyTorch DDP training job over gloo that prints its step time: a job measuring its own gain.

Started on every node of the job (by the user's launcher, under ``topo-tune exec``), it takes its place from
what ``topo-tune exec`` exports: ``TOPO_TUNE_NODE_RANK`` (this node's rank in the job's tuned order),
``TOPO_TUNE_NNODES`` and ``TOPO_TUNE_MASTER_ADDR`` (where node rank 0 holds the rendezvous). One process per
node; a two-layer MLP whose gradients are ``--grad-mib`` MiB, so each optimizer step all-reduces that much
over gloo's ring, which follows the ranks' order. After ``--warmup`` steps it times ``--steps`` steps and
prints, on every rank, ``step_time_ms: <median>`` (what ``topo-tune exec --compare --metric`` reads from node
rank 0), with the gradient size and the order it ran in.

``--bind ADDR`` binds gloo's sockets to this node's address (a host with several, such as a network namespace
whose host name resolves elsewhere); without it gloo picks the address the host name resolves to.

Non-goals: a real model, GPUs (this is the CPU fabric's job), elastic restarts.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroupGloo, TCPStore  # type: ignore[attr-defined]
from torch.nn.parallel import DistributedDataParallel

_BACKEND = "bound_gloo"


def _required(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        sys.exit(f"ddp_step_time: {name} is not set; run under `topo-tune exec` (it exports the job's node rank)")
    return value


def _register_bound_gloo(address: str) -> None:
    """A gloo backend whose sockets bind to ``address`` (the private options type is the only way in)."""

    def create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
        options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = timeout
        options._devices = [ProcessGroupGloo.create_device(hostname=address)]
        return ProcessGroupGloo(store, rank, size, options)

    dist.Backend.register_backend(_BACKEND, create, devices=["cpu"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grad-mib", type=float, default=4.0, help="gradient size per step, MiB (default 4)")
    parser.add_argument("--steps", type=int, default=6, help="timed optimizer steps (default 6)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--port", type=int, default=29500, help="rendezvous port on node rank 0 (default 29500)")
    parser.add_argument("--bind", default="", help="the address gloo binds to on this node")
    parser.add_argument("--timeout", type=float, default=120.0, help="rendezvous and collective timeout, s")
    args = parser.parse_args(argv)

    rank = int(_required("TOPO_TUNE_NODE_RANK"))
    world = int(_required("TOPO_TUNE_NNODES"))
    master = _required("TOPO_TUNE_MASTER_ADDR")
    timeout = datetime.timedelta(seconds=args.timeout)
    torch.set_num_threads(1)  # one process per node; many nodes may share a small test machine's cores
    torch.manual_seed(0)  # every rank starts from the same weights (DDP broadcasts rank 0's anyway)
    store = TCPStore(master, args.port, world, is_master=rank == 0, timeout=timeout)
    backend = "gloo"
    if args.bind:
        _register_bound_gloo(args.bind)
        backend = _BACKEND
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout)

    # Two square layers: 2 * (width^2 + width) float32 parameters, one gradient of each per step.
    width = max(8, int(math.sqrt(args.grad_mib * 2**20 / 4 / 2)))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ddp = DistributedDataParallel(model, bucket_cap_mb=max(25, math.ceil(grad_bytes / 2**20) + 1))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    times: list[float] = []
    for step in range(args.warmup + args.steps):
        inputs = torch.randn(args.batch, width, generator=generator)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = ddp(inputs).pow(2).mean()
        loss.backward()  # DDP all-reduces the gradients here, over gloo's ring in rank order
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
    dist.barrier()
    order = os.environ.get("TOPO_TUNE_NODE_ORDER", "")
    print(
        f"rank {rank}/{world}: gradients {grad_bytes / 2**20:.2f} MiB, {args.steps} steps, "
        f"order {order or '(not exported)'}, steps ms {' '.join(f'{t * 1e3:.0f}' for t in times)}"
    )
    print(f"step_time_ms: {statistics.median(times) * 1e3:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
