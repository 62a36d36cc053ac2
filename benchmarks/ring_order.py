"""Ring-order optimizer benchmark: time and bottleneck quality on random rack-structured instances.

Run: ``python benchmarks/ring_order.py [--seeds N]``. For n <= 12 the heuristic (forced) is compared with the
exact optimum; for n = 64, 256, 1024 the optimizer's result is compared with an upper bound (every member's second
best link; every rack boundary's second best crossing link). Times are CPU seconds of this process (one core).
Targets: n = 1024 in < 2 s; bottleneck within 1% of the bound. For comparison, the last two columns give the
bottleneck of the members in index order (racks contiguous, as a sorted hostfile of well-named hosts gives) and in
a random order (as an arbitrary scheduler placement gives), relative to the same reference. A bottleneck
limited by the spine is the same for every order that crosses it, so the crossings column shows the other half
of the objective: how often the ring uses the spine (ours / random order; the minimum is the number of racks).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from topo_tune.tuner.ring.instances import rack_instance
from topo_tune.tuner.ring.model import ring_metrics, upper_bound
from topo_tune.tuner.ring.optimizer import optimize_ring

SHAPES = {
    # name: (rack size, spine oversubscription, share of nodes with a half-rate NIC)
    "flat spine, healthy": (32, 1.0, 0.0),
    "2:1 spine, healthy": (32, 2.0, 0.0),
    "2:1 spine, 3% degraded": (32, 2.0, 0.03),
}


def _timed(fn):  # type: ignore[no-untyped-def]
    start = time.process_time()
    result = fn()
    return result, time.process_time() - start


def _crossings(order: tuple[int, ...] | list[int], racks: list[str]) -> int:
    return sum(racks[order[i]] != racks[order[(i + 1) % len(order)]] for i in range(len(order)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="instances per row")
    args = parser.parse_args()
    header = (
        f"{'instances':<24} {'n':>5} {'reference':<9} {'time s (max)':>12} "
        f"{'quality (min)':>13} {'quality (mean)':>14} {'index order':>11} {'random order':>12} "
        f"{'crossings':>14}"
    )
    print(header)
    print("-" * len(header))
    for shape, (rack_size, over, degraded) in SHAPES.items():
        for n in (8, 12, 64, 256, 1024):
            times, quality, naive, shuffled = [], [], [], []
            crossings: list[tuple[int, int]] = []
            for seed in range(args.seeds):
                inst = rack_instance(
                    n,
                    rack_size=min(rack_size, max(2, n // 4)),
                    seed=seed,
                    spine_oversubscription=over,
                    degraded_share=degraded,
                )
                if n <= 12:
                    exact = optimize_ring(inst.bandwidth, inst.latency)
                    ring, seconds = _timed(
                        lambda inst=inst: optimize_ring(inst.bandwidth, inst.latency, racks=inst.racks, exact_limit=3)
                    )
                    reference = exact.bottleneck_gbps
                else:
                    ring, seconds = _timed(
                        lambda inst=inst: optimize_ring(inst.bandwidth, inst.latency, racks=inst.racks)
                    )
                    reference = upper_bound(inst.bandwidth, inst.racks)
                times.append(seconds)
                quality.append(ring.bottleneck_gbps / reference)
                naive.append(ring_metrics(list(range(n)), inst.bandwidth, inst.latency)[0] / reference)
                order = list(range(n))
                random.Random(seed).shuffle(order)
                shuffled.append(ring_metrics(order, inst.bandwidth, inst.latency)[0] / reference)
                crossings.append((_crossings(ring.order, inst.racks), _crossings(order, inst.racks)))
            ref_name = "exact" if n <= 12 else "bound"
            print(
                f"{shape:<24} {n:>5} {ref_name:<9} {max(times):>12.3f} {min(quality):>13.4f} "
                f"{statistics.mean(quality):>14.4f} {statistics.mean(naive):>11.4f} {statistics.mean(shuffled):>12.4f} "
                f"{max(c[0] for c in crossings):>6} / {max(c[1] for c in crossings):<5}"
            )


if __name__ == "__main__":
    main()
