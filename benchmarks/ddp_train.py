"""A torchrun DDP training job over NCCL whose gradient buckets are 1, 4, 16 and 64 MiB; prints its step time.

Started by ``torchrun --nproc_per_node=N`` (one process per GPU), usually under ``topo-tune exec``. More
processes than GPUs wrap around onto them (local rank r on GPU r mod GPUs): several ranks on one GPU, which
needs NCCL >= 2.30 with ``NCCL_MULTI_RANK_GPU_ENABLE=1`` (benchmarks/results/h200-one-gpu-ranks.md). The model
is five float32 linear layers without bias (512→512, 512→2048, 2048→2048, 2048→8192, 8192→32), and DDP gets
``bucket_cap_mb=1``: a bucket closes as soon as it holds at least its cap, so each weight's gradient is its own
bucket and every optimizer step all-reduces exactly 1, 64, 16, 4 and 1 MiB (in the order backward makes them
ready), 86 MiB per step. After ``--warmup`` steps it times ``--steps`` steps (CUDA-synchronised) and global rank
0 prints ``step_time_ms: <median>``, the line ``topo-tune exec --compare --metric 'step_time_ms: ([0-9.]+)'``
reads.

``--profile-dir DIR`` also profiles ``--profile-steps`` steps after the timed ones with ``torch.profiler``
(CPU and CUDA activity, ``record_shapes=True``) and writes one gzip'd Chrome trace per rank,
``DIR/rank<R>.json.gz``, for ``topo-tune workload import``.

NVLink multicast stays off: the job sets ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and
``NVSHMEM_DISABLE_NVLS=1`` where the environment has not set them (its caller should set them too).

Non-goals: a real model or data, mixed precision, elastic restarts, more than one node's worth of checks.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# (in, out) of each bias-free float32 layer: weights of 1, 4, 16, 64 and 1 MiB.
LAYERS = ((512, 512), (512, 2048), (2048, 2048), (2048, 8192), (8192, 32))
BUCKET_CAP_MB = 1
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def bucket_bytes() -> list[int]:
    """The bytes of each gradient bucket, in the order DDP all-reduces them (the last layer's first)."""
    return [i * o * 4 for i, o in reversed(LAYERS)]


def _model() -> nn.Module:
    layers: list[nn.Module] = []
    for index, (i, o) in enumerate(LAYERS):
        layers.append(nn.Linear(i, o, bias=False))
        if index < len(LAYERS) - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--profile-dir", type=Path, default=None, help="write rank<R>.json.gz profiler traces here")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled after the timed ones")
    parser.add_argument("--timeout", type=float, default=300.0, help="NCCL collective timeout, s")
    args = parser.parse_args(argv)
    for name, value in MULTICAST_OFF.items():
        os.environ.setdefault(name, value)  # before NCCL initialises: multicast can wedge a shared host's GPUs
    if "LOCAL_RANK" not in os.environ:
        sys.exit("ddp_train: LOCAL_RANK is not set; start it with torchrun --nproc_per_node=<GPUs>")
    local_rank = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = _model().to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank], bucket_cap_mb=BUCKET_CAP_MB)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(rank)

    def step() -> None:
        inputs = torch.randn(args.batch, LAYERS[0][0], device=device, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        ddp(inputs).pow(2).mean().backward()  # DDP all-reduces each bucket here, over NCCL
        optimizer.step()

    times: list[float] = []
    for index in range(args.warmup + args.steps):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        if index >= args.warmup:
            times.append(time.perf_counter() - start)
    if args.profile_dir is not None:
        _profile(step, steps=args.profile_steps, out=args.profile_dir / f"rank{rank}.json.gz")
    dist.barrier()
    if rank == 0:
        sizes = " ".join(f"{b / 2**20:g}" for b in bucket_bytes())
        print(
            f"world {world}: buckets MiB {sizes}, {args.steps} steps, order "
            f"{os.environ.get('TOPO_TUNE_NODE_ORDER', '(not exported)')}, "
            f"steps ms {' '.join(f'{t * 1e3:.2f}' for t in times)}"
        )
        print(f"step_time_ms: {statistics.median(times) * 1e3:.3f}", flush=True)
    dist.destroy_process_group()


def _profile(step: Callable[[], None], *, steps: int, out: Path) -> None:
    """Profile ``steps`` calls of ``step`` and write a gzip'd Chrome trace to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    plain = out.with_suffix("")  # rank<R>.json
    prof.export_chrome_trace(str(plain))
    with plain.open("rb") as source, gzip.open(out, "wb") as sink:
        shutil.copyfileobj(source, sink)
    plain.unlink()


if __name__ == "__main__":
    main()
