"""Harness overhead per operation against a bare torch.distributed loop (target <= 5% at >= 1 MiB).

Two comparisons, gloo on this host's CPUs, all_reduce over ``--ranks`` processes:

1. *Per-op, interleaved* (``interleaved_gloo_loops.py``): in the same processes, blocks of the
   worker's own op and timing loop alternate with blocks of a plain ``dist.all_reduce`` loop; the
   overhead is the median over paired blocks. Load from elsewhere on the host hits both alike.
2. *End to end*: rounds of (a job through ``BenchmarkExecutor`` -- launcher, worker processes,
   data check) and (a bare loop in separate processes); the best time of each per size.

Usage: ``python benchmarks/harness_overhead.py [--ranks 3] [--rounds 3] [--blocks 21]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, aggregate, plan_job
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import rank_result_from_proto, spec_to_proto

HERE = Path(__file__).resolve().parent
TARGET = 0.05


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(sys.path),
        "GLOO_SOCKET_IFNAME": "lo",
    }


def _spawn(script: str, ranks: int, args: list[str]) -> str:
    port = str(_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / script), str(r), str(ranks), port, *args],
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for r in range(ranks)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{script} failed")
    return outputs[0]


def interleaved(sizes: list[int], *, ranks: int, iters: int, blocks: int) -> list[str]:
    data = json.loads(_spawn("interleaved_gloo_loops.py", ranks, [str(iters), str(blocks), *map(str, sizes)]))
    lines = [
        "Per-op overhead, interleaved in the same processes (busbw GB/s, medians over blocks):",
        "",
        f"| bytes | bare busbw | harness busbw | overhead (median of {blocks} paired blocks) | target |",
        "|---|---|---|---|---|",
    ]
    for size in sizes:
        blocks_ = data[str(size)]
        paired = statistics.median(b / h - 1 for h, b in zip(blocks_["harness"], blocks_["bare"], strict=True))
        verdict = "ok" if size < 1 << 20 or paired <= TARGET else "MISSED"
        bare_med, harness_med = statistics.median(blocks_["bare"]), statistics.median(blocks_["harness"])
        lines.append(f"| {size} | {bare_med:.4f} | {harness_med:.4f} | {paired * 100:+.1f}% | {verdict} |")
    return [*lines, ""]


def bare_loop(sizes: list[int], *, ranks: int, iters: int) -> dict[int, float]:
    """Mean seconds per all_reduce from a plain loop in separate processes (1 block, no harness)."""
    data = json.loads(_spawn("interleaved_gloo_loops.py", ranks, [str(iters), "1", *map(str, sizes)]))
    # busbw -> time: t = bytes * 2(n-1)/n / busbw.
    return {int(s): int(s) / 1e9 * 2 * (ranks - 1) / ranks / v["bare"][0] for s, v in data.items()}


def end_to_end(sizes: list[int], *, ranks: int, iters: int, rounds: int) -> list[str]:
    executor = BenchmarkExecutor(policy=EnvPolicy())
    harness: dict[int, list[float]] = {s: [] for s in sizes}
    bare: dict[int, list[float]] = {s: [] for s in sizes}
    for r in range(rounds):
        spec = plan_job(
            job_id=f"overhead-{r}",
            collective=Collective.ALL_REDUCE,
            sweep=SizeSweep(sizes[0], sizes[-1], 4),
            dtype=dtype_named("float32"),
            nodes=[JobNode("local", "127.0.0.1", ranks)],
            rendezvous_port=_port(),
            env={},
            gpu_devices=False,
            iters=iters,
            warmup_iters=1,
        )
        result = executor.execute(
            spec_to_proto(spec),
            node_name="local",
            backend=Backend.GLOO,
            deadline_s=600,
            work_dir=Path(tempfile.mkdtemp()),
        )
        if result.status != agent_pb2.COMMAND_STATUS_SUCCEEDED:
            raise SystemExit(result.message)
        for row in aggregate(spec, [rank_result_from_proto(x) for x in result.node_benchmark.ranks]):
            harness[row.bytes].append(row.time_us / 1e6)
        for size, seconds in bare_loop(sizes, ranks=ranks, iters=iters).items():
            bare[size].append(seconds)
    lines = [
        f"End to end: agent path vs bare loop in separate processes, best of {rounds} interleaved rounds:",
        "",
        "| bytes | bare best (us) | harness best (us) | overhead | bare rounds (us) | harness rounds (us) |",
        "|---|---|---|---|---|---|",
    ]
    for size in sizes:
        over = min(harness[size]) / min(bare[size]) - 1
        lines.append(
            f"| {size} | {min(bare[size]) * 1e6:.0f} | {min(harness[size]) * 1e6:.0f} | {over * 100:+.1f}% "
            f"| {', '.join(f'{x * 1e6:.0f}' for x in bare[size])} "
            f"| {', '.join(f'{x * 1e6:.0f}' for x in harness[size])} |"
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=21)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    sizes = [1 << 20, 4 << 20, 16 << 20]
    load = os.getloadavg()
    out = [
        f"# harness overhead, gloo all_reduce over {args.ranks} processes "
        f"({os.cpu_count()} CPUs, load average {load[0]:.1f} at start)",
        "",
    ]
    out += interleaved(sizes, ranks=args.ranks, iters=2, blocks=args.blocks)
    out += end_to_end(sizes, ranks=args.ranks, iters=args.iters, rounds=args.rounds)
    print("\n".join(out))


if __name__ == "__main__":
    main()
