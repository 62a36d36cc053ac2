"""Sim backend throughput: evaluations per second against cluster size (target: >= 10,000/s at 64 nodes).

One evaluation is one collective at one size for one (environment, rank order). Three loads:

* ``tuner`` — one size per call, the environment drawn from 64 distinct configs (what a study does once
  its configs repeat), one rank order;
* ``sweep`` — a 12-size ladder per call (each size counts), environments as above;
* ``new order`` — a 12-size ladder per call with a rank order never seen before (worst case: nothing
  cached but the parsed environments).

Run: ``python benchmarks/sim_throughput.py [--seconds 0.5]``. All figures printed are simulated-model
throughput on this machine's CPU, not GPU results.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from topo_tune.sim import Cluster, simulate
from topo_tune.sim.demo import scale_cluster

SHAPES = [(2, 4), (8, 8), (16, 16), (40, 25)]  # racks x nodes per rack: 8, 64, 256, 1000 nodes
LADDER = [1 << k for k in range(6, 30, 2)]


def _envs(count: int, rng: random.Random) -> list[dict[str, str]]:
    envs: list[dict[str, str]] = [{}]
    while len(envs) < count:
        ctas = rng.choice(["8", "16", "32", "64"])
        envs.append(
            {
                "NCCL_MIN_CTAS": ctas,
                "NCCL_MAX_CTAS": ctas,
                "NCCL_NTHREADS": rng.choice(["128", "256", "512"]),
                "NCCL_BUFFSIZE": str(rng.choice([1, 2, 4, 8, 16]) << 20),
                "NCCL_IB_QPS_PER_CONNECTION": rng.choice(["1", "2", "4", "8", "16"]),
                "NCCL_NVLS_ENABLE": rng.choice(["0", "2"]),
            }
        )
    return envs


def _rate(body: Callable[[int], int], seconds: float) -> float:
    """Evaluations per second of ``body(i)`` (which returns how many evaluations it did)."""
    done, i = 0, 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += body(i)
        i += 1
    return done / elapsed


def measure(cluster: Cluster, seconds: float) -> tuple[float, float, float]:
    rng = random.Random(0)
    envs = _envs(64, rng)
    order = list(cluster.node_names)
    rng.shuffle(order)
    sizes = LADDER

    def tuner(i: int) -> int:
        simulate(
            cluster,
            collective="all_reduce",
            sizes=[sizes[i % len(sizes)]],
            env=envs[i % len(envs)],
            rank_order=order,
            seed=i,
        )
        return 1

    def sweep(i: int) -> int:
        simulate(cluster, collective="all_reduce", sizes=sizes, env=envs[i % len(envs)], rank_order=order, seed=i)
        return len(sizes)

    def new_order(i: int) -> int:
        fresh = order[:]
        rng.shuffle(fresh)
        simulate(cluster, collective="all_reduce", sizes=sizes, env=envs[i % len(envs)], rank_order=fresh, seed=i)
        return len(sizes)

    for env in envs:  # warm the plan cache the way a study's first trials do
        simulate(cluster, collective="all_reduce", sizes=[1024], env=env, rank_order=order, seed=0)
    return _rate(tuner, seconds), _rate(sweep, seconds), _rate(new_order, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    args = parser.parse_args()
    print("sim backend throughput (all_reduce; evaluations/s; simulated model, CPU only)")
    print(f"{'nodes':>6} {'ranks':>6} {'tuner':>10} {'sweep':>10} {'new order':>10}  target")
    for racks, per_rack in SHAPES:
        cluster = scale_cluster(racks=racks, nodes_per_rack=per_rack)
        tuner, sweep, fresh = measure(cluster, args.seconds)
        nodes = racks * per_rack
        target = ">= 10,000 tuner" if nodes == 64 else ""
        verdict = ("  ok" if tuner >= 10_000 else "  MISSED") if target else ""
        print(f"{nodes:>6} {nodes * 8:>6} {tuner:>10,.0f} {sweep:>10,.0f} {fresh:>10,.0f}  {target}{verdict}")


if __name__ == "__main__":
    main()
