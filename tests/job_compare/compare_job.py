"""A job for the ``exec --compare`` tests: its nodes meet in a gloo all_reduce, then node rank 0 prints a step time.

Run by ``topo-tune exec --compare`` on each node: the rendezvous is the job's own synchronisation (as torchrun's
is), a second all_reduce fails the run (exit 3) unless every node runs the same config version, and each node
appends ``RUN NODE ARM VERSION RANK`` to ``$COMPARE_TEST_LOG``. The step time depends on the arm's version:
the candidate's is half of NCCL's defaults', with a small spread that differs by run.
"""

from __future__ import annotations

import hashlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    rank = int(os.environ["TOPO_TUNE_NODE_RANK"])
    world = int(os.environ["TOPO_TUNE_NNODES"])
    run = int(os.environ["TOPO_TUNE_COMPARE_RUN"])
    # A file rendezvous per run: both "nodes" share this machine, and no port can be taken by another test.
    store = os.path.join(os.environ["COMPARE_TEST_STORE"], f"rendezvous-{run}")
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    version = os.environ["TOPO_TUNE_CONFIG_VERSION"]
    mine = int(hashlib.sha256(version.encode()).hexdigest()[:12], 16)
    high = torch.tensor([mine], dtype=torch.int64)
    low = high.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    with open(os.environ["COMPARE_TEST_LOG"], "a", encoding="utf-8") as log:
        arm = os.environ["TOPO_TUNE_COMPARE_ARM"]
        log.write(f"{run} {os.environ['TOPO_TUNE_NODE_NAME']} {arm} {version or 'defaults'} {rank}\n")
    if int(high) != int(low):
        print("the nodes ran different config versions in one run", file=sys.stderr)
        return 3
    if rank == 0:
        step = (0.5 if version else 1.0) * (1 + 0.004 * ((run * 7) % 5))
        print(f"step 1 step_time=9.9 (warm-up)\nmean step_time={step:.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
