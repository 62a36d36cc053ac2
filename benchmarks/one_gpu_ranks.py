"""N real NCCL ranks sharing one GPU: the tuner plugin's per-size choices against NCCL's log, and job fixed cost.

Three subcommands (``benchmarks/one_gpu_ranks.sh`` drives the first two on the GPU machine):

- ``launch --ranks N --scenario S --out DIR``: starts N rank processes on ``cuda:0`` (NCCL >= 2.30 with
  ``NCCL_MULTI_RANK_GPU_ENABLE=1``, MPS running) and waits for them. Each rank all_reduces every size of
  ``SIZES`` (WARMUP untimed calls, then ITERS timed ones) and prints one ``RANKTIME`` JSON line: wall-clock
  seconds from its launch to torch imported, CUDA ready, NCCL communicator up (eager init), first collective
  done, all sizes done and the communicator destroyed; and the median time per call of each size.
  Scenario ``baseline`` loads no tuner plugin; ``plugin`` loads the one named by ``PLUGIN`` with ``TABLE``
  (every size forced to one algorithm/protocol/channel count) and the plugin's per-rank record.
- ``summarize DIR``: reads those logs (on any machine) and prints, per N and size, NCCL's TUNING line of
  rank 0, the table's row, whether they agree, every rank's record line, and the fixed-cost phases.

The worker needs only torch; ``summarize`` reads the record with :mod:`topo_tune.plugin.record`.
Non-goals: speed claims. N ranks on one GPU measure one GPU's HBM and the MPS scheduler, not links.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = tuple(1024 * 4**i for i in range(9))  # 1 KiB .. 64 MiB, float32
WARMUP, ITERS = 3, 20
RUN_DEADLINE_S = 120.0  # a run that hangs (one rank stuck in init) is killed, not waited on
# One row per size bucket, each a different algorithm/protocol, so agreement cannot happen by chance:
# NCCL's own picks on one GPU are ring or tree with LL at small sizes and simple at large ones.
TABLE_ROWS = (
    (0, 2048, "tree", "ll", 2),
    (2049, 8192, "ring", "ll128", 4),
    (8193, 32768, "tree", "simple", 4),
    (32769, 131072, "ring", "ll", 8),
    (131073, 524288, "tree", "ll128", 8),
    (524289, 2097152, "ring", "simple", 16),
    (2097153, 8388608, "tree", "ll", 16),
    (8388609, 17179869184, "ring", "ll128", 32),
)
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
NCCL_CHOICE = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
PHASES = ("imported", "cuda", "init", "first", "done")


def table_text() -> str:
    head = "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\n"
    return head + "".join(f"allreduce,{lo},{hi},{a},{p},{c},-1,-1\n" for lo, hi, a, p, c in TABLE_ROWS)


def table_row(n_bytes: int) -> tuple[str, str, int]:
    return next((a, p, c) for lo, hi, a, p, c in TABLE_ROWS if lo <= n_bytes <= hi)


def worker(rank: int, world: int, port: int, launched: float) -> None:
    stamps = {}
    import torch
    import torch.distributed as dist

    stamps["imported"] = time.time()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    stamps["cuda"] = time.time()
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
    )
    stamps["init"] = time.time()
    per_size = {}
    wrong = []
    for index, n_bytes in enumerate(SIZES):
        tensor = torch.full((n_bytes // 4,), float(rank + 1), device=device)
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        if index == 0:
            stamps["first"] = time.time()
        if not bool(torch.all(tensor == world * (world + 1) / 2).item()):
            wrong.append(n_bytes)
        for _ in range(WARMUP):
            dist.all_reduce(tensor)
        torch.cuda.synchronize()
        times = []
        for _ in range(ITERS):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(tensor)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        per_size[n_bytes] = statistics.median(times)
    dist.destroy_process_group()
    stamps["done"] = time.time()
    since = {name: round(stamps[name] - launched, 4) for name in PHASES}
    report = {"rank": rank, "world": world, "since_launch_s": since, "median_us": per_size, "wrong": wrong}
    report["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    print("RANKTIME " + json.dumps(report), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(ranks: int, scenario: str, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **SAFE_ENV, "NCCL_MULTI_RANK_GPU_ENABLE": "1", "PYTHONUNBUFFERED": "1"}
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING,ENV", NCCL_IB_DISABLE="1")
    if scenario == "plugin":
        table = out / "table.csv"
        table.write_text(table_text())
        env.update(NCCL_TUNER_PLUGIN=os.environ["PLUGIN"], NCCL_TUNER_CONFIG_FILE=str(table))
    port = free_port()
    procs = []
    for rank in range(ranks):
        rank_env = dict(env)
        if scenario == "plugin":
            rank_env["TOPOTUNE_TUNER_RECORD"] = str(out / f"record-rank{rank}.csv")
        log = (out / f"rank{rank}.log").open("w")
        cmd = [sys.executable, __file__, "worker", str(rank), str(ranks), str(port), repr(time.time())]
        procs.append((subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=subprocess.STDOUT), log))
    codes = []
    deadline = time.monotonic() + RUN_DEADLINE_S
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
        log.close()
    (out / "exit-codes").write_text(" ".join(map(str, codes)) + "\n")
    print(f"{out.name}: exit codes {codes}", flush=True)
    return max(codes, key=abs)


def rank_reports(run: Path) -> list[dict[str, object]]:
    reports = []
    for log in sorted(run.glob("rank*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("RANKTIME "):
                reports.append(json.loads(line.removeprefix("RANKTIME ")))
    return reports


def nccl_choices(run: Path) -> dict[int, set[str]]:
    choices: dict[int, set[str]] = {}
    for line in (run / "rank0.log").read_text(errors="replace").splitlines():
        match = NCCL_CHOICE.search(line)
        if match:
            size, algo, proto, lo, hi = match.groups()
            channels = int(hi) - int(lo) + 1
            choices.setdefault(int(size), set()).add(f"{algo.lower()}/{proto.lower()} ch={channels}")
    return choices


def summarize(root: Path) -> None:
    from topo_tune.plugin.record import parse_record

    runs = sorted(p for p in root.iterdir() if (p / "exit-codes").exists())
    print("## Per-size agreement (plugin runs): NCCL's TUNING line (rank 0) vs the table vs every rank's record\n")
    for run in (r for r in runs if "plugin" in r.name):
        print(f"### {run.name} (exit codes {(run / 'exit-codes').read_text().strip()})\n")
        records = {}
        for path in sorted(run.glob("record-rank*.csv")):
            rank = int(path.stem.removeprefix("record-rank"))
            records[rank] = {c.bytes: c for c in parse_record(path.read_text(), source=path.name)}
        choices = nccl_choices(run)
        print("| bytes | table | NCCL TUNING (rank 0) | agrees | records: nccl -> applied, channels (ranks) |")
        print("|---|---|---|---|---|")
        for n_bytes in SIZES:
            algo, proto, channels = table_row(n_bytes)
            seen = choices.get(n_bytes, set())
            agree = bool(seen) and all(s.startswith(f"{algo}/{proto} ") for s in seen)
            views = {}
            for rank, calls in records.items():
                call = calls.get(n_bytes)
                view = "missing" if call is None else f"{call.nccl} -> {call.applied}, {call.channels}"
                views.setdefault(view, []).append(rank)
            cells = "; ".join(f"{v} ({','.join(map(str, r))})" for v, r in views.items())
            table = f"{algo}/{proto} ch={channels}"
            nccl = ", ".join(sorted(seen)) or "none"
            print(f"| {n_bytes} | {table} | {nccl} | {'yes' if agree else 'NO'} | {cells} |")
        print()
    print("## Median time per all_reduce (us), rank 0, per run\n")
    print("| run | " + " | ".join(str(s) for s in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for run in runs:
        reports = [r for r in rank_reports(run) if r["rank"] == 0]
        if reports:
            medians = reports[0]["median_us"]
            assert isinstance(medians, dict)
            print(f"| {run.name} | " + " | ".join(f"{medians[str(s)]:.0f}" for s in SIZES) + " |")
    print("\n## Fixed cost per job: seconds from launch (slowest rank), per phase\n")
    print("| run | ranks ok | " + " | ".join(PHASES) + " | wrong sums |")
    print("|---|---|" + "---|" * len(PHASES) + "---|")
    for run in runs:
        reports = rank_reports(run)
        if not reports:
            print(f"| {run.name} | 0 | " + " | ".join("-" for _ in PHASES) + " | - |")
            continue
        worst = {p: max(float(r["since_launch_s"][p]) for r in reports) for p in PHASES}  # type: ignore[index]
        wrong = sum(len(r["wrong"]) for r in reports)  # type: ignore[arg-type]
        print(f"| {run.name} | {len(reports)} | " + " | ".join(f"{worst[p]:.2f}" for p in PHASES) + f" | {wrong} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("launch", help="start N ranks on cuda:0 and wait for them")
    run.add_argument("--ranks", type=int, required=True)
    run.add_argument("--scenario", choices=("baseline", "plugin"), required=True)
    run.add_argument("--out", type=Path, required=True)
    report = sub.add_parser("summarize", help="print the tables from a results directory")
    report.add_argument("root", type=Path)
    args = parser.parse_args()
    if args.command == "launch":
        sys.exit(launch(args.ranks, args.scenario, args.out.resolve()))
    summarize(args.root)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    else:
        main()
