"""A benchmark job's fixed cost with fresh workers against kept ones (target on a GPU: <= 0.5 s a job).

Runs ``--jobs`` small jobs per mode through the agent's own ``BenchmarkExecutor`` (launcher, worker processes,
rendezvous, data check, and on ``nccl`` the tuner plugin staged and recording, as on an agent). A job is one
all_reduce size with a few iterations, so its time inside timed loops is milliseconds and the rest of its
wall time is fixed cost. Modes:

- ``fresh``: no kept workers; every job starts its processes as new interpreters (interpreter, torch, CUDA,
  communicator);
- ``fresh, forked``: no kept workers; every job's processes are forked from the launcher's pre-imported fork
  server (``fork_server``; the agent's default), so only CUDA and the communicator are new;
- ``kept worker, same env``: every job after the first runs in the kept processes, with a new rendezvous and a
  new communicator (``kept_communicators=False``);
- ``kept communicator, same env``: the same, and every job after the first also reuses the communicator;
- ``kept, tables alternate``: a different tuner table each job (table-only trials; NCCL reads it per
  communicator), same processes, a new communicator each job;
- ``kept, A/B envs``: two environments alternating (the interleaved proof's pattern), two idle sets, each
  keeping its communicator.

For each mode: the first job's wall time, median and p90 of the later jobs' wall time, and medians over the later
jobs of rank 0's phases (from the job's start to its worker's first progress line: the process start and imports
when fresh; from there to its communicator being up: the rendezvous and the process group, made or reused; from
its result written to the job's end: the communicator's destruction where it is not kept, and the launcher
collecting the job), its time in timed loops, and how many of the later jobs' ranks ran in a kept process and
reused a kept communicator (from each rank's progress).

Usage (repository root):

    python benchmarks/worker_reuse.py --backend gloo --ranks 2 --jobs 10
    python benchmarks/worker_reuse.py --backend nccl --ranks 1 --jobs 10
    python benchmarks/worker_reuse.py --backend nccl --ranks 2 --ranks-per-gpu 2 --jobs 10

``--ranks-per-gpu N`` puts N ranks on each GPU (NCCL >= 2.30 where the workers load it, e.g. through
``LD_PRELOAD``; start the CUDA MPS daemon first). The workers get ``LD_LIBRARY_PATH``, ``LD_PRELOAD`` and the
``CUDA_MPS_*`` directories of this shell (an agent's ``passthrough``), and NVLink multicast off.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor
from topo_tune.agent.bench.tuner_plugin import TunerPluginStage
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, plan_job
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import spec_to_proto

NODE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PASSTHROUGH_KEYS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
ENV_A = {"NCCL_DEBUG": "WARN"}
ENV_B = {"NCCL_DEBUG": "WARN", "NCCL_BUFFSIZE": "8388608"}
TABLES = (
    "allreduce,0,1048576,ring,simple,2,-1,-1\n",
    "allreduce,0,1048576,tree,simple,2,-1,-1\n",
)
SIZE = 65536


_PORTS = itertools.count(random.randrange(20000, 30000))


def _port() -> int:
    """A job's rendezvous port as the controller draws them (``port_range``, 20000-29999), one not bound now.

    Never one the system picked (binding to port 0): that comes from the ephemeral range, where the ranks' own
    outgoing connections take their local ports, so rank 0 could find it taken when it listens (EADDRINUSE: a
    kept communicator's store connection held one once, on the GPU, two ranks per GPU).
    """
    for _ in range(10000):
        port = 20000 + next(_PORTS) % 10000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 20000-29999")


@dataclass(frozen=True, slots=True)
class JobTimes:
    wall: float
    timed: float
    """Rank 0's seconds in timed loops."""
    reused: int
    """Ranks that ran in a process that had run a job before."""
    kept_communicators: int
    """Ranks that reused a kept communicator."""
    to_started: float
    """From the job's start to rank 0's first progress line."""
    to_joined: float
    """From there to rank 0's communicator being up (made or reused)."""
    after_finished: float
    """From rank 0's result written to the job's end."""


class Bench:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.backend = Backend(args.backend)
        self.ranks: int = args.ranks
        self.ranks_per_gpu: int = args.ranks_per_gpu
        self.iters: int = args.iters
        self.root = root
        self.stage = TunerPluginStage(installed_dirs=(), build_dir=root / "plugin", table_dir=root / "tables")
        self.policy = EnvPolicy(config_dirs=(self.stage.table_dir,), plugin_dirs=self.stage.plugin_dirs)
        self.passthrough = {k: os.environ[k] for k in PASSTHROUGH_KEYS if os.environ.get(k)}
        self.count = 0

    def executor(self, kept_sets: int, *, kept_communicators: bool, fork_server: bool) -> BenchmarkExecutor:
        return BenchmarkExecutor(
            fork_server=fork_server,
            policy=self.policy,
            passthrough=self.passthrough,
            node_env=NODE_ENV if self.backend.runs_nccl else {},
            tuner_plugin=self.stage,
            ranks_per_gpu=self.ranks_per_gpu,
            kept_worker_sets=kept_sets,
            kept_communicators=kept_communicators,
        )

    def spec(self, env: Mapping[str, str], table: str) -> BenchmarkSpec:
        self.count += 1
        return plan_job(
            job_id=f"reuse-{self.count}",
            collective=Collective.ALL_REDUCE,
            sweep=SizeSweep(SIZE, SIZE, 2),
            dtype=dtype_named("float32"),
            nodes=[JobNode("local", "127.0.0.1", self.ranks)],
            rendezvous_port=_port(),
            env=dict(env),
            gpu_devices=self.backend.runs_nccl,
            iters=self.iters,
            warmup_iters=2,
            tuner_table=table,
        )

    def job(self, executor: BenchmarkExecutor, spec: BenchmarkSpec) -> JobTimes:
        """One job's wall time, rank 0's phases and seconds in timed loops, and what its ranks reused."""
        work = self.root / "work"
        began = time.time()
        start = time.perf_counter()
        result = executor.execute(
            spec_to_proto(spec), node_name="local", backend=self.backend, deadline_s=300, work_dir=work
        )
        wall = time.perf_counter() - start
        ended = time.time()
        if result.status != agent_pb2.COMMAND_STATUS_SUCCEEDED:
            raise SystemExit(f"job {spec.job_id}: {agent_pb2.CommandStatus.Name(result.status)}: {result.message}")
        rank0 = result.node_benchmark.ranks[0]
        timed = sum(s.time_us * spec.iters for s in rank0.sizes) / 1e6
        reused = kept_communicators = 0
        phases: dict[str, dict[str, Any]] = {}
        for rank in range(spec.world_size):
            lines = (work / spec.job_id / f"rank-{rank}" / "progress.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines]
            reused += records[0]["jobs_before"] > 0
            firsts = {r["phase"]: r for r in reversed(records)}  # each phase's first record
            kept_communicators += firsts["joined"]["communicator"] == "kept"
            if rank == 0:
                phases = firsts
        at = {phase: float(record["at"]) for phase, record in phases.items()}
        return JobTimes(
            wall=wall,
            timed=timed,
            reused=reused,
            kept_communicators=kept_communicators,
            to_started=at["started"] - began,
            to_joined=at["joined"] - at["started"],
            after_finished=ended - at["finished"],
        )


def run_mode(
    bench: Bench,
    *,
    kept_sets: int,
    kept_communicators: bool,
    fork_server: bool,
    jobs: int,
    pick: Callable[[int], tuple[Mapping[str, str], str]],
) -> str:
    executor = bench.executor(kept_sets, kept_communicators=kept_communicators, fork_server=fork_server)
    try:
        rows = [bench.job(executor, bench.spec(*pick(i))) for i in range(jobs)]
    finally:
        executor.stop()
    later = rows[1:]
    walls = sorted(row.wall for row in later)
    p90 = walls[min(len(walls) - 1, int(0.9 * len(walls)))]

    def median(field: Callable[[JobTimes], float]) -> float:
        return statistics.median(field(row) for row in later)

    ranks = len(later) * bench.ranks
    return (
        f"| {rows[0].wall:.2f} | {statistics.median(walls):.3f} | {p90:.3f} | {median(lambda r: r.to_started):.3f} "
        f"| {median(lambda r: r.to_joined):.3f} | {median(lambda r: r.after_finished):.3f} "
        f"| {median(lambda r: r.timed) * 1e3:.1f} | {sum(r.reused for r in later)}/{ranks} "
        f"| {sum(r.kept_communicators for r in later)}/{ranks} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--ranks", type=int, default=2, help="ranks on this host (nccl: one a GPU slot)")
    parser.add_argument("--ranks-per-gpu", type=int, default=1, help="nccl: ranks sharing each GPU (NCCL >= 2.30)")
    parser.add_argument("--jobs", type=int, default=10, help="jobs per mode (the first one starts the workers)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per job")
    parser.add_argument(
        "--fork-server",
        choices=("on", "off"),
        default="on",
        help="fork fresh workers from a pre-imported process in the kept modes (on: as the agent does); "
        "off also leaves out the 'fresh, forked' mode",
    )
    args = parser.parse_args()
    if args.jobs < 2:
        parser.error("--jobs must be at least 2: the first job of a mode starts its workers")
    with tempfile.TemporaryDirectory(prefix="worker-reuse-") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            bench.stage.library()
            tables_ok = True
        except ValueError as exc:
            print(f"tuner plugin unavailable ({exc}): the nccl jobs run unrecorded, no tables mode")
            tables_ok = False
        forked = args.fork_server == "on"
        modes: list[tuple[str, int, bool, bool, Callable[[int], tuple[Mapping[str, str], str]]]] = [
            ("fresh", 0, False, False, lambda i: (ENV_A, "")),
            ("fresh, forked", 0, False, True, lambda i: (ENV_A, "")),
            ("kept worker, same env", 2, False, forked, lambda i: (ENV_A, "")),
            ("kept communicator, same env", 2, True, forked, lambda i: (ENV_A, "")),
            ("kept, A/B envs", 2, True, forked, lambda i: ((ENV_A, ENV_B)[i % 2], "")),
        ]
        if args.fork_server == "off":
            del modes[1]
        if tables_ok:
            modes.insert(-1, ("kept, tables alternate", 2, True, forked, lambda i: (ENV_A, TABLES[i % 2])))
        print(
            f"backend {args.backend}, {args.ranks} rank(s) on one host"
            + (f", {args.ranks_per_gpu} per GPU" if args.backend == "nccl" else "")
            + f", all_reduce {SIZE} B x {args.iters} iters, {args.jobs} jobs per mode"
        )
        print()
        print(
            "| mode | first job (s) | later jobs: median (s) | p90 (s) | to worker start (s) "
            "| rendezvous + communicator (s) | after the result (s) | in timed loops (ms) | ranks reused "
            "| communicators reused |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, kept_sets, kept_communicators, fork_server, pick in modes:
            row = run_mode(
                bench,
                kept_sets=kept_sets,
                kept_communicators=kept_communicators,
                fork_server=fork_server,
                jobs=args.jobs,
                pick=pick,
            )
            print(f"| {name} " + row, flush=True)


if __name__ == "__main__":
    main()
