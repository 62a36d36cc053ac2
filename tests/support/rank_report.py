"""One rank of a test job under a real launcher: prints where it runs and the rank each launcher gave it.

Prints one line ``rank-report {json}``: the host name, the launchers' rank variables (``SLURM_PROCID``,
``OMPI_COMM_WORLD_RANK``, torchrun's ``RANK``) and what ``topo-tune exec`` exported. With ``--all-reduce-mib``
it joins a gloo process group (torchrun's ``env://`` rendezvous), times that all_reduce (the median of
``--iters``, after one warm-up) and adds torch's own rank and the time.

Non-goals: NCCL and GPUs (gloo's ring follows the rank order as NCCL's inter-node ring does).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

SHOWN = (
    "SLURM_PROCID",
    "SLURM_NODEID",
    "SLURMD_NODENAME",
    "OMPI_COMM_WORLD_RANK",
    "RANK",
    "TOPO_TUNE_JOB_ID",
    "TOPO_TUNE_CONFIG_VERSION",
    "TOPO_TUNE_NODE_RANK",
    "TOPO_TUNE_NODE_ORDER",
    "TOPO_TUNE_MASTER_ADDR",
    "NCCL_CONF_FILE",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all-reduce-mib", type=float, default=0.0, help="time a gloo all_reduce of this size")
    parser.add_argument("--iters", type=int, default=3, help="timed all_reduce calls")
    args = parser.parse_args()
    report: dict[str, object] = {"host": socket.gethostname(), **{name: os.environ.get(name, "") for name in SHOWN}}
    if args.all_reduce_mib:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        tensor = torch.ones(int(args.all_reduce_mib * 2**20) // 4)
        dist.all_reduce(tensor)
        times = []
        for _ in range(args.iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        report["torch_rank"] = dist.get_rank()
        report["all_reduce_s"] = statistics.median(times)
        dist.destroy_process_group()
    print("rank-report " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
