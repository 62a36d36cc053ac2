"""A bare torch.distributed + NCCL timing loop, independent of topo-tune's harness.

``python benchmarks/bare_nccl_loop.py BACKEND COLLECTIVE ITERS WARMUP SIZE...`` (one process,
world size 1, GPU 0 for ``nccl``, the CPU for ``gloo``; COLLECTIVE is ``all_reduce`` (in place) or
``all_gather`` (out of place)) prints one JSON object: size in bytes -> mean microseconds per
call, timed with CUDA events (nccl) or perf_counter (gloo) around the loop.
"""

import datetime
import functools
import json
import socket
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    backend, collective, iters, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sizes = [int(x) for x in sys.argv[5:]]
    cuda = backend == "nccl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=datetime.timedelta(seconds=60))
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    else:
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    out = {}
    for size in sizes:
        a = torch.ones(size // 4, device=device)
        b = torch.empty_like(a)
        op = functools.partial(dist.all_reduce, a) if collective == "all_reduce" else functools.partial(gather, b, a)
        for _ in range(warmup + 1):
            op()
        if not cuda:
            t0 = time.perf_counter()
            for _ in range(iters):
                op()
            out[size] = (time.perf_counter() - t0) * 1e6 / iters
            continue
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            op()
        end.record()
        end.synchronize()
        out[size] = start.elapsed_time(end) * 1e3 / iters
    dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
