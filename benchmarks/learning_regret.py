"""SIMULATED: what learning inside production jobs costs (regret) and how many jobs it takes to learn, on the
demo cluster (sim backend), against the dedicated cluster time of ``topo-tune init``.

A version carries one challenger table beside its chosen one, which runs NCCL's own choice as the model prices
it. The challenger changes the 1 MiB to 4 MiB all_reduce rows. The model finds no table there more than 2 %
faster than NCCL's choice on the demo, and a challenger reaches production only when the proof found it
non-inferior; what a job sees beyond that (interleaving with compute, other sizes) the model does not price.
So its in-job effect there is an ASSUMPTION, one per scenario: **better** (8 % faster: a gain the
micro-benchmark missed), **as slow as allowed** (2 % slower: the proof's ``maxLoss``, the worst an admitted
challenger may be) and **same** (other rows, the same speed). Each simulated job has its own workload mix
(1,000 all_reduce calls over 64 KiB, 1 MiB, 4 MiB and 16 MiB, Dirichlet weights per job: synthetic mixes,
not imported traces), its own load (a job factor, lognormal 3 %) and per-call noise (lognormal 5 %); its arm is drawn by
``learning.assignment`` from the version and its id, exactly as the controller draws it; its ranks' timing
records hold one call in 64 timed, as the profiler samples. After every 5 jobs the evidence is computed with
``learning.version_evidence`` (the proof's default statistics), as ``admin learning evidence`` does.

Per scenario and exploration share: the jobs that explored; what exploring itself cost (the jobs' collective time
on their arms minus on the chosen table: negative when the challenger is faster); the regret (collective time
against the per-size oracle, the faster of the two tables at each size, over every job of the window: the
proposal is not rolled out within it), each per job and as a share of a job's collective time;
and the jobs until the evidence proposes the challenger (better: the chosen table then matches the oracle;
slower or the same: it must never be proposed, and the chosen table matches the oracle from the start).
``init``'s cost on the same demo is dedicated cluster time: 2,987 node-seconds (``benchmarks/results/demo.md``);
exploring takes none, only the regret inside jobs that run anyway.

Usage: ``python benchmarks/learning_regret.py [--jobs 200] [--seed 1] [--record FILE]``.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

from topo_tune.ids import ConfigVersionId
from topo_tune.learning.assignment import Exploration, LearningSwitches, assign_arm
from topo_tune.learning.version_evidence import version_evidence
from topo_tune.plugin.timing_record import TimingCell, TimingRecord
from topo_tune.sim import demo_cluster, simulate

SIZES = (1 << 16, 1 << 20, 1 << 22, 1 << 24)
CALLS = 1000
SAMPLE = 64
INIT_NODE_SECONDS = 2987.0
HEADER = "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n"
LOW, HIGH = (512 << 10) + 1, 4 << 20
SCENARIOS = {"better": 0.92, "as slow as allowed": 1.02, "same": 1.0}
"""The challenger's time over the chosen table's within [LOW, HIGH] (an assumption: see above)."""
VERSION = ConfigVersionId("cv-5e5e5e5e5e5e5e5e")


def model_times(force: dict[str, str]) -> dict[int, float]:
    cluster = demo_cluster()
    result = simulate(cluster, collective="all_reduce", sizes=SIZES, env=force, rank_order=cluster.node_names, seed=0)
    return {s.bytes: s.model_time_us for s in result.sizes}


def job_records(job: int, arm: int, times: dict[int, float], rng: random.Random) -> tuple[list[TimingRecord], float]:
    """The job's two ranks' records (every cell timed 1 in SAMPLE) and its true collective time in µs."""
    weights = [rng.gammavariate(1.0, 1.0) for _ in SIZES]
    load = math.exp(rng.gauss(0.0, 0.03))
    cells, total = [], 0.0
    for size, weight in zip(SIZES, weights, strict=True):
        calls = max(1, round(CALLS * weight / sum(weights)))
        total += calls * times[size] * load
        logs = [math.log(times[size] * load * 1e3) + rng.gauss(0.0, 0.05) for _ in range(max(1, calls // SAMPLE))]
        sum_ns = int(sum(math.exp(v) for v in logs))
        cells.append(
            TimingCell(
                "allreduce", size, "tree/ll128", calls, len(logs), sum_ns, 0, 0, sum(logs), sum(v * v for v in logs)
            )
        )
    records = [TimingRecord(f"h{r}:{job}", 0xABC, r, 2, 1, SAMPLE, arm, 0, 0, tuple(cells)) for r in (0, 1)]
    return records, total


def run(scenario: str, share: float, *, jobs: int, seed: int) -> dict[str, object]:
    chosen = model_times({})
    challenger = {s: chosen[s] * SCENARIOS[scenario] if LOW <= s <= HIGH else chosen[s] for s in SIZES}
    oracle = {s: min(chosen[s], challenger[s]) for s in SIZES}
    tables = [HEADER, HEADER + f"allreduce,{LOW},{HIGH},tree,ll128,-1,8,64\n"]
    rng = random.Random(seed)
    exploration = Exploration(VERSION, 1, share)
    by_job: dict[str, list[TimingRecord]] = {}
    regret = exploring = 0.0
    explored = proposed_at = 0
    time_total = 0.0
    for n in range(jobs):
        job_id = f"sim-job-{seed}-{n}"
        arm = assign_arm(exploration, job_id, switches=LearningSwitches(cluster_enabled=True), job_env={})
        arm_times = challenger if arm else chosen
        state = rng.getstate()
        records, total = job_records(n, arm, arm_times, rng)
        rng.setstate(state)  # the same job on the oracle: the same mix, load and noise
        _, best = job_records(n, arm, oracle, rng)
        rng.setstate(state)  # and on the chosen table: what exploring itself cost this job
        _, unexplored = job_records(n, arm, chosen, rng)
        regret += total - best
        exploring += total - unexplored
        time_total += total
        explored += arm
        by_job[job_id] = records
        if not proposed_at and (n + 1) % 5 == 0:
            evidence = version_evidence(VERSION, by_job, tables=tables)
            if evidence.proposable:
                proposed_at = n + 1
    should = any(challenger[s] < chosen[s] for s in SIZES)
    return {
        "scenario": scenario,
        "share": share,
        "jobs": jobs,
        "explored": explored,
        "regret_us_per_job": regret / jobs,
        "exploring_us_per_job": exploring / jobs,
        "exploring_share": exploring / time_total,
        "regret_share": regret / time_total,
        "proposed_at": proposed_at,
        "should_propose": should,
        "regret_node_s": regret * 8 / 1e6,
    }


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| scenario (SIMULATED) | share | jobs | explored | exploring's cost per job | of collective time "
        "| regret against the oracle per job | of collective time | proposed after | regret, node-seconds "
        "| init, node-seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["proposed_at"]:
            proposed = f"{r['proposed_at']} jobs" + ("" if r["should_propose"] else " (WRONG: worse challenger)")
        else:
            proposed = "never (right: the chosen table is the oracle)" if not r["should_propose"] else "not yet"
        lines.append(
            f"| {r['scenario']} | {r['share']} | {r['jobs']} | {r['explored']} "
            f"| {float(r['exploring_us_per_job']):+.1f} µs | {float(r['exploring_share']):+.3%} "  # type: ignore[arg-type]
            f"| {float(r['regret_us_per_job']):.1f} µs | {float(r['regret_share']):.3%} "  # type: ignore[arg-type]
            f"| {proposed} | {float(r['regret_node_s']):.3f} | {INIT_NODE_SECONDS:,.0f} |"  # type: ignore[arg-type]
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--record", type=Path, help="append the table, with the command, to this file")
    args = parser.parse_args()
    rows = []
    for scenario in SCENARIOS:
        for share in (0.1, 0.25, 0.5):
            rows.append(run(scenario, share, jobs=args.jobs, seed=args.seed))
            print(f"{scenario} share {share}: done", file=sys.stderr)
    text = table(rows)
    print(text)
    if args.record is not None:
        command = f"python benchmarks/learning_regret.py --jobs {args.jobs} --seed {args.seed}"
        with args.record.open("a", encoding="utf-8") as out:
            out.write(f"\n`{command}`\n\n{text}")


if __name__ == "__main__":
    main()
