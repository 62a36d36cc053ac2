"""A plain torch.distributed gloo all_reduce timing loop over several hosts, independent of the harness.

``python -m tests.support.bare_loop --rank R --world-size W --master ADDR:PORT --bind ADDR --iters N
--warmup K SIZE...``: rank 0 hosts the TCPStore; every rank binds gloo to its own address (a namespace
host's). Each size: warm-up calls, one call every rank enters before the clocks start, then ``N`` timed
calls; rank 0 prints one JSON object, size in bytes -> the slowest rank's mean microseconds per call.
This is the loop a user would write to check topo-tune's numbers, so it shares no code with topo-tune.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroupGloo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0's store")
    parser.add_argument("--bind", required=True, help="this rank's address")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("sizes", type=int, nargs="+")
    args = parser.parse_args()
    host, port = args.master.rsplit(":", 1)
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore(host, int(port), args.world_size, is_master=args.rank == 0, timeout=timeout)
    options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timeout
    options._devices = [ProcessGroupGloo.create_device(hostname=args.bind)]
    group = ProcessGroupGloo(store, args.rank, args.world_size, options)
    times: dict[int, float] = {}
    for size in args.sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(args.warmup + 1):
            group.allreduce([tensor]).wait()
        start = time.perf_counter()
        for _ in range(args.iters):
            group.allreduce([tensor]).wait()
        mean = torch.tensor([(time.perf_counter() - start) / args.iters])
        slowest = dist.AllreduceOptions()
        slowest.reduceOp = dist.ReduceOp.MAX
        group.allreduce([mean], slowest).wait()
        times[size] = float(mean.item()) * 1e6
    if args.rank == 0:
        print(json.dumps(times))


if __name__ == "__main__":
    main()
