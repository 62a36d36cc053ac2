"""Probe round planning for 8, 64 and 512 simulated nodes, printed as a table.

A probe round measures every node pair once. ``probe_rounds`` packs the n(n-1)/2 pairs into
rounds of disjoint pairs that run in parallel (a node probes one peer at a time), so the round
takes n-1 (even n) or n (odd n) probe slots instead of n(n-1)/2 serial ones. The table gives the
planning time (best of ``--repeat``) and, for an assumed duration of one probe, the wall time of
the round against probing pair by pair.

Usage: ``python benchmarks/probe_round.py [--probe-seconds 5] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import time

from topo_tune.controller.benchmarks.plan import probe_rounds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe-seconds", type=float, default=5.0, help="assumed duration of one probe")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        "| nodes | pairs | rounds | max pairs per round | planning time (ms) "
        f"| round wall (est., {args.probe_seconds:g} s per probe) | serial wall (est.) |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (8, 64, 512):
        nodes = [f"node-{i:04d}" for i in range(n)]
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            rounds = probe_rounds(nodes)
            best = min(best, time.perf_counter() - start)
        pairs = sum(len(r) for r in rounds)
        widest = max(len(r) for r in rounds)
        print(
            f"| {n} | {pairs} | {len(rounds)} | {widest} | {best * 1e3:.3f} "
            f"| {len(rounds) * args.probe_seconds / 60:.1f} min | {pairs * args.probe_seconds / 60:.1f} min |"
        )


if __name__ == "__main__":
    main()
