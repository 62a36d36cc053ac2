"""The nccl backend's harness against a bare torch.distributed loop, on the GPUs of this host.

For all_reduce (in place, 8 B..1 GiB) and all_gather (out of place, 1 MiB..4 GiB) it interleaves
rounds of (harness job through the agent's own worker spawning, data check on) and (the bare
loop ``bare_nccl_loop.py`` in its own process), and compares the best time per size of each:
with one GPU most sizes only measure how fast the CPU launches calls, and that varies from
process to process, so single runs cannot be compared. Prints both as nccl-tests tables, the
per-size comparison, then every collective once through the harness; writes the report to
``--out``.

Usage: ``python benchmarks/nccl_harness_vs_bare.py --gpus 2 --out report.md`` (both sides run one
process per GPU and report the slowest rank; ``NCCL_NVLS_ENABLE=0`` on both sides). ``--timing graph``
compares both sides timed as CUDA graphs (nccl-tests ``-G``: the harness's ``cuda_graph`` jobs against
the bare loop's ``--graph``); the default runs eager and then graph.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor
from topo_tune.agent.bench.launcher import BASE_ENV
from topo_tune.benchmark.collectives import bandwidth, shape
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.results import SizeMeasurement
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.benchmark.table import TableContext, render_table
from topo_tune.controller.benchmarks.plan import JobNode, aggregate, plan_job
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import rank_result_from_proto, spec_to_proto

# NVLink multicast stays off on shared hosts (NVLS can take a host's GPUs out of service).
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Agent-side passthrough (not from the job): the driver libraries may only be found through it.
PASSTHROUGH = {k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def harness(
    collective: Collective,
    sweep: SizeSweep,
    *,
    gpus: int,
    iters: int,
    warmup: int,
    job_id: str,
    placements: tuple[bool, ...] = (False, True),
    env: Mapping[str, str] = ENV,
    policy: EnvPolicy | None = None,
    work_dir: Path | None = None,
    cuda_graph: bool = False,
) -> tuple[BenchmarkSpec, tuple[SizeMeasurement, ...], float, dict[str, str]]:
    """One job through the agent's executor; ``work_dir`` keeps each rank's log (``JOB/rank-N/stderr.log``)."""
    spec = plan_job(
        job_id=job_id,
        collective=collective,
        sweep=sweep,
        dtype=dtype_named("float32"),
        nodes=[JobNode("local", "127.0.0.1", gpus)],
        rendezvous_port=_port(),
        env=dict(env),
        gpu_devices=BACKEND == "nccl",
        iters=iters,
        warmup_iters=warmup,
        placements=placements,
        cuda_graph=cuda_graph,
    )
    executor = BenchmarkExecutor(policy=policy or EnvPolicy(), passthrough=PASSTHROUGH)
    start = time.perf_counter()
    result = executor.execute(
        spec_to_proto(spec),
        node_name="local",
        backend=BACKEND,
        deadline_s=540,
        work_dir=work_dir or Path(tempfile.mkdtemp()),
    )
    wall = time.perf_counter() - start
    if result.status != agent_pb2.COMMAND_STATUS_SUCCEEDED:
        raise SystemExit(f"{collective}: {agent_pb2.CommandStatus.Name(result.status)}: {result.message}")
    ranks = [rank_result_from_proto(r) for r in result.node_benchmark.ranks]
    return spec, aggregate(spec, ranks), wall, dict(ranks[0].effective_env)


BACKENDS = ("nccl", "gloo")
BACKEND = "nccl"  # --backend gloo runs the same comparison on CPUs (a dry run off the GPU host)
BARE_LOOP = Path(__file__).with_name("bare_nccl_loop.py")


def bare(
    collective: Collective, sweep: SizeSweep, *, gpus: int, iters: int, warmup: int, graph: bool = False
) -> dict[int, float]:
    """Mean us per call (slowest rank) from the bare loop, one process per GPU like the harness's workers.

    It gets the environment a harness worker gets (the launcher's fixed base, the passthrough and the
    job's variables), so that nothing but the code differs between the two sides.
    """
    home = tempfile.mkdtemp()
    env = {**BASE_ENV, "HOME": home, "TMPDIR": home, **PASSTHROUGH, **ENV}
    out = subprocess.run(
        [
            sys.executable,
            str(BARE_LOOP),
            BACKEND,
            collective.value,
            str(iters),
            str(warmup),
            str(gpus),
            *(["--graph"] if graph else []),
            *map(str, sweep.sizes()),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def _rows(
    collective: Collective, sweep: SizeSweep, times_us: dict[int, float], *, in_place: bool, nranks: int
) -> list[SizeMeasurement]:
    rows = []
    for size in sweep.sizes():
        shp = shape(collective, size_bytes=size, element_size=4, nranks=nranks)
        algbw, busbw = bandwidth(collective, shape=shp, seconds=times_us[size] / 1e6, nranks=nranks)
        rows.append(
            SizeMeasurement(
                shp.reported_bytes,
                shp.param_count,
                in_place,
                times_us[size],
                algbw,
                busbw,
                0,
                False,
                0.0,
                0.0,
                0.0,
            )
        )
    return rows


def _reported(collective: Collective, size: int, nranks: int) -> int:
    return shape(collective, size_bytes=size, element_size=4, nranks=nranks).reported_bytes


def compare(
    collective: Collective,
    sweep: SizeSweep,
    *,
    gpus: int,
    iters: int,
    warmup: int,
    rounds: int,
    in_place: bool,
    graph: bool,
) -> list[str]:
    """Interleave harness and bare runs; compare the best time of each per size."""
    placements = (in_place,)
    harness_runs: list[dict[int, float]] = []
    bare_runs: list[dict[int, float]] = []
    first: dict[int, SizeMeasurement] = {}
    wrong: dict[int, int] = {}
    for r in range(rounds):
        _, rows, _, _ = harness(
            collective,
            sweep,
            gpus=gpus,
            iters=iters,
            warmup=warmup,
            job_id=f"h200-{collective.value}-{'graph' if graph else 'eager'}-{r}",
            placements=placements,
            cuda_graph=graph,
        )
        by_size = {m.bytes: m for m in rows}
        first = first or by_size
        for m in rows:
            wrong[m.bytes] = wrong.get(m.bytes, 0) + m.wrong
        harness_runs.append({size: by_size[_reported(collective, size, gpus)].time_us for size in sweep.sizes()})
        bare_runs.append(bare(collective, sweep, gpus=gpus, iters=iters, warmup=warmup, graph=graph))
    best_h = {s: min(run[s] for run in harness_runs) for s in sweep.sizes()}
    best_b = {s: min(run[s] for run in bare_runs) for s in sweep.sizes()}
    ctx = TableContext(
        collective,
        dtype_named("float32"),
        gpus,
        sweep.min_bytes,
        sweep.max_bytes,
        sweep.step_factor,
        warmup,
        iters,
        True,
        cuda_graph=graph,
    )
    harness_table = [
        dataclasses.replace(
            first[n.bytes],
            time_us=n.time_us,
            algbw_gbps=n.algbw_gbps,
            busbw_gbps=n.busbw_gbps,
            wrong=wrong[n.bytes],
        )
        for n in _rows(collective, sweep, best_h, in_place=in_place, nranks=gpus)
    ]
    timing = "CUDA graphs (-G)" if graph else "eager"
    title = f"## {collective.value} ({'in' if in_place else 'out-of'}-place), {timing}, {rounds} interleaved rounds"
    out = [title, ""]
    out += [
        "Harness (agent worker spawning, data check on; best of the rounds per size):",
        "",
        "```",
        render_table(ctx, harness_table),
        "```",
        "",
    ]
    out += [
        "Bare torch.distributed loop (own process, CUDA events around the loop"
        + (" of one graph replay" if graph else "")
        + "; best of the rounds):",
        "",
        "```",
        render_table(
            dataclasses.replace(ctx, check=False), _rows(collective, sweep, best_b, in_place=in_place, nranks=gpus)
        ),
        "```",
        "",
    ]
    out += [
        "| bytes | bare best (us) | harness best (us) | harness/bare | bare rounds (us) | harness rounds (us) |",
        "|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for size in sweep.sizes():
        ratio = best_h[size] / best_b[size]
        if size >= 1 << 20:
            worst = max(worst, abs(ratio - 1))
        out.append(
            f"| {size} | {best_b[size]:.2f} | {best_h[size]:.2f} | {ratio:.3f} | "
            f"{', '.join(f'{r[size]:.1f}' for r in bare_runs)} | "
            f"{', '.join(f'{r[size]:.1f}' for r in harness_runs)} |"
        )
    out += ["", f"**Largest deviation at >= 1 MiB: {worst * 100:.1f}%**", ""]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="nccl")
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=0, help="pin this process and its children to N CPUs")
    parser.add_argument(
        "--timing", choices=("eager", "graph"), action="append", help="repeatable; default: eager, then graph"
    )
    parser.add_argument(
        "--skip-all-collectives", action="store_true", help="only the two comparisons, not every collective once"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    global BACKEND  # noqa: PLW0603 -- one script-wide switch, set once from the command line
    BACKEND = args.backend
    if args.cpus:
        # Children inherit the affinity: harness workers and bare loops then launch from the same
        # cores, which removes one source of process-to-process variation in launch-bound sizes.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])
    out = ["# nccl backend: harness vs bare torch.distributed loop", ""]
    out += [f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`", ""]
    out += [f"CPU affinity: {sorted(os.sched_getaffinity(0))}", ""]
    if BACKEND == "nccl":
        out += [
            f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
            f"{torch.cuda.get_device_name(0)} x{args.gpus}, job env {ENV}",
            "",
        ]
    pairs = (
        (Collective.ALL_REDUCE, SizeSweep(8, args.max_bytes, 2), True),
        (Collective.ALL_GATHER, SizeSweep(1 << 20, 4 * args.max_bytes, 2), False),
    )
    for graph in [t == "graph" for t in args.timing or ("eager", "graph")]:
        for collective, sweep, in_place in pairs:
            out += compare(
                collective,
                sweep,
                gpus=args.gpus,
                iters=args.iters,
                warmup=args.warmup,
                rounds=args.rounds,
                in_place=in_place,
                graph=graph,
            )
            args.out.write_text("\n".join(out))  # what is done survives a later timeout
    others = SizeSweep(1024, 64 << 20, 8)
    graphs = [False] + ([True] if BACKEND == "nccl" and "graph" in (args.timing or ("graph",)) else [])
    graphs = [] if args.skip_all_collectives else graphs
    eff: dict[str, str] = {}
    for graph in graphs:
        timing = "CUDA graphs" if graph else "eager"
        out += [f"## Every collective through the harness, {timing} (both placements where they exist, check on)", ""]
        for coll in Collective:
            if coll is Collective.SENDRECV and BACKEND == "gloo" and args.gpus == 1:
                continue  # gloo cannot send to itself; NCCL can
            _, rows, _, eff = harness(
                coll,
                others,
                gpus=args.gpus,
                iters=20,
                warmup=2,
                job_id=f"h200-all-{coll.value}-{int(graph)}",
                cuda_graph=graph,
            )
            cctx = TableContext(
                coll,
                dtype_named("float32"),
                args.gpus,
                others.min_bytes,
                others.max_bytes,
                8,
                2,
                20,
                True,
                cuda_graph=graph,
            )
            out += [f"{coll.value}:", "", "```", render_table(cctx, rows), "```", ""]
    out += [f"Worker effective env (last job): {dict(sorted(eff.items()))}", ""]
    text = "\n".join(out)
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
