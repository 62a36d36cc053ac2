"""A bare torch.distributed + NCCL timing loop, independent of topo-tune's harness.

``python benchmarks/bare_nccl_loop.py BACKEND COLLECTIVE ITERS WARMUP NRANKS [--graph] SIZE...`` runs NRANKS
processes on this host (rank r on GPU r for ``nccl``, the CPU for ``gloo``; COLLECTIVE is
``all_reduce`` (in place) or ``all_gather`` (out of place, SIZE is the output buffer as in
nccl-tests)) and prints one JSON object: size in bytes -> mean microseconds per call of the slowest
rank (as the harness aggregates), timed with CUDA events (nccl) or perf_counter (gloo) around the
loop. ``--graph`` (nccl only) captures the ITERS calls in one CUDA graph and times one replay of
it, like nccl-tests ``-G``. Rank 0 starts the other ranks as child processes of this same script.
"""

import datetime
import faulthandler
import functools
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def _run_rank(
    backend: str, collective: str, *, iters: int, warmup: int, nranks: int, rank: int, port: int, sizes, graph: bool
):
    cuda = backend == "nccl"
    store = dist.TCPStore("127.0.0.1", port, nranks, is_master=rank == 0, timeout=datetime.timedelta(seconds=120))
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=nranks, device_id=device)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=nranks)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    out = {}
    for size in sizes:
        if collective == "all_reduce":
            a = torch.ones(size // 4, device=device)
            op = functools.partial(dist.all_reduce, a)
        else:
            b = torch.empty(size // 4, device=device)
            a = torch.ones(size // 4 // nranks, device=device)
            op = functools.partial(gather, b, a)
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
        if graph:
            # Captured and replayed on a side stream: NCCL kernels replayed on the legacy default
            # stream hang (it serialises with NCCL's own streams).
            stream = torch.cuda.Stream(device)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local"):
                for _ in range(iters):
                    op()
            with torch.cuda.stream(stream):
                g.replay()
                start.record()
                g.replay()
                end.record()
            torch.cuda.synchronize(device)
            del g  # no graph holding NCCL work outlives its size while eager calls run
        else:
            start.record()
            for _ in range(iters):
                op()
            end.record()
        end.synchronize()
        out[size] = start.elapsed_time(end) * 1e3 / iters
    # The slowest rank's time per size, like the harness's aggregate.
    times = torch.tensor([out[s] for s in sizes], dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()
    return dict(zip(sizes, times.tolist(), strict=True))


def main() -> None:
    if os.environ.get("BARE_WATCHDOG_S"):
        faulthandler.dump_traceback_later(float(os.environ["BARE_WATCHDOG_S"]), exit=True)
    backend, collective = sys.argv[1], sys.argv[2]
    iters, warmup, nranks = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    rank, port = 0, 0
    rest = sys.argv[6:]
    graph = "--graph" in rest
    rest = [a for a in rest if a != "--graph"]
    if rest and rest[0] == "--rank":
        rank, port, rest = int(rest[1]), int(rest[2]), rest[3:]
    sizes = [int(x) for x in rest]
    children = []
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for r in range(1, nranks):
            argv = [sys.executable, __file__, *sys.argv[1:6], "--rank", str(r), str(port), *map(str, sizes)]
            argv += ["--graph"] if graph else []
            children.append(subprocess.Popen(argv, env=os.environ, stdout=subprocess.DEVNULL))
    out = _run_rank(
        backend, collective, iters=iters, warmup=warmup, nranks=nranks, rank=rank, port=port, sizes=sizes, graph=graph
    )
    for child in children:
        if child.wait(timeout=300) != 0:
            raise SystemExit(f"bare loop rank exited with {child.returncode}")
    if rank == 0:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
