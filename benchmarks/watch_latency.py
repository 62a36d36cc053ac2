"""How long after a benchmark job's last result is committed does ``admin bench run`` return?

A real controller process and two sim agents on loopback (SQLite). Each run holds the second agent stopped
(SIGSTOP) while ``admin bench run`` starts the job, lets the CLI wait for ``--hold`` seconds, then resumes
the agent. The commit time is the controller's own: the time it stamps on the row of the job's last node
result, taken just before that row's transaction commits (so the latency is if anything overstated). The
return time is this process's ``time.time()`` when the CLI command (run in-process through its click entry
point, as the tests do) returns, after printing its table. Same machine, same clock. The CLI's RPCs are
counted by a client interceptor: a run should make exactly two (StartBenchmark, WatchBenchmark), however long
it waits.

Usage: ``python benchmarks/watch_latency.py [--runs 30] [--hold 0.3]``.
Target (issue 14): the CLI returns within 100 ms of the commit, with no RPC while it waits. Before the
watch stream it polled every 0.5 s: about 250 ms on average and up to 500 ms, plus one RPC per poll.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import grpc

from tests.support.processes import LocalCluster
from tests.support.waiting import wait_until
from tests.test_cli_watch import NODES, Calls, bench_run_waiting, ready


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--hold", type=float, default=0.3, help="seconds the CLI waits on the stopped agent")
    args = parser.parse_args()
    calls = Calls()
    plain = grpc.insecure_channel
    grpc.insecure_channel = lambda *a, **k: grpc.intercept_channel(plain(*a, **k), calls)
    with tempfile.TemporaryDirectory() as workdir:
        cluster = LocalCluster(
            workdir=Path(workdir), database_url=f"sqlite:///{workdir}/topo-tune.db", heartbeat_expiry=60
        )
        try:
            cluster.start_controller()
            for name in NODES:
                cluster.start_agent(name)
            wait_until(lambda: ready(cluster) == set(NODES), what="two ready nodes")
            runs = [bench_run_waiting(cluster, calls, hold_s=args.hold) for _ in range(args.runs)]
        finally:
            cluster.stop()
    latencies = sorted(run.latency_s * 1000 for run in runs)
    rpcs = sorted({len(run.rpcs) for run in runs})
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    print("| runs | min (ms) | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | runs over 100 ms | RPCs per run |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {len(latencies)} | {latencies[0]:.1f} | {quantiles[49]:.1f} | {quantiles[89]:.1f} | {quantiles[98]:.1f} "
        f"| {latencies[-1]:.1f} | {sum(1 for x in latencies if x > 100)} | {', '.join(map(str, rpcs))} |"
    )


if __name__ == "__main__":
    main()
