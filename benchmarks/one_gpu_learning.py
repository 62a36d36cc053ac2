"""The tables of benchmarks/results/h200-learning.md, from benchmarks/one_gpu_learning.sh's output folder.

``python -m benchmarks.one_gpu_learning summarize OUT`` reads ``OUT/runs/<arm>-r<round>/`` (each DDP run's log
and the profiler's timing records) and ``OUT/perf-<arm>-<round>.log`` (nccl-tests), and prints:

* per run: its exit, the median step time, its records and whether every rank's record of what ran agrees
  (``learning.evidence.divergence``);
* learning's cost: each round's learning-on time (chosen arm) over the same round's learning-off time, paired
  over the rounds with the proof's statistics (``tuner.statistics.compare``);
* what the records learn: the challenger against the chosen table per (collective, size class), one job a
  sample (``learning.evidence.compare_arms``), beside nccl-tests' ratio of the two tables at the same sizes;
* learning's cost per call: nccl-tests without graphs, the profiler on over off (``OUT/cost-<arm>-<round>.log``),
  paired over the rounds per size;
* per size of ``perf-tuning.log``'s sweep, the challenger table's row against NCCL's own TUNING lines.

Non-goals: running anything on the GPU (the shell script does), any claim about links between GPUs.
"""

from __future__ import annotations

import math
import re
import statistics as stats
import sys
from pathlib import Path

from benchmarks.plugin_cost import read_log
from topo_tune.learning.assignment import ArmIndex
from topo_tune.learning.evidence import compare_arms, divergence, job_timing
from topo_tune.plugin.timing_record import TimingRecord, parse_timing_record
from topo_tune.tuner import statistics

_TUNING = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
_STEP = re.compile(r"step_time_ms: ([0-9.]+)")
_RC = re.compile(r"^== \S+ rc=(\d+) wall=([0-9.]+)s", re.M)


def _runs(out: Path) -> dict[tuple[str, int], Path]:
    runs = {}
    for path in sorted((out / "runs").iterdir()):
        arm, _, rnd = path.name.rpartition("-r")
        runs[(arm, int(rnd))] = path
    return runs


def _step_ms(run: Path) -> float | None:
    found = _STEP.findall((run / "job.log").read_text(encoding="utf-8", errors="replace"))
    return float(found[-1]) if found else None


def _records(run: Path) -> list[TimingRecord]:
    return [
        parse_timing_record(p.read_text(encoding="utf-8"), source=p.name)
        for p in sorted((run / "records").glob("topo-tune-timing.*.txt"))
    ]


def summarize(out: Path) -> None:
    runs = _runs(out)
    rounds = sorted({r for _, r in runs})
    print("| run | step ms (median) | timing records | timed calls | what ran, every rank |")
    print("|---|---|---|---|---|")
    jobs = []
    for (arm, rnd), run in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
        step = _step_ms(run)
        records = _records(run) if arm != "off" else []
        findings = divergence(records) if records else []
        timed = sum(c.timed for r in records for c in r.cells)
        agree = "-" if arm == "off" else ("agree" if records and not findings else "; ".join(findings) or "none")
        print(f"| {arm}-r{rnd} | {step if step is not None else 'FAILED'} | {len(records)} | {timed} | {agree} |")
        if records and not findings:
            jobs.append(job_timing(records))
    print()
    off = [_step_ms(runs[("off", r)]) for r in rounds]
    on = [_step_ms(runs[("arm0", r)]) for r in rounds]
    pairs = [(a, b) for a, b in zip(off, on, strict=True) if a is not None and b is not None]
    if len(pairs) >= 2:
        c = statistics.compare([a for a, _ in pairs], [b for _, b in pairs])
        print(
            f"learning on (chosen arm, profiler sampling) over off, {len(pairs)} interleaved rounds: step time "
            f"x{1 / c.speedup:.4f}, {100 * (1 - 2 * c.alpha):.0f} % CI [{1 / c.ci_high:.4f}, {1 / c.ci_low:.4f}]"
        )
        print()
    print(
        "| collective | size class (bytes) | jobs | challenger speedup (records) | interval | decision "
        "| nccl-tests chosen/challenger |"
    )
    print("|---|---|---|---|---|---|---|")
    micro = _micro(out)
    for cmp in compare_arms(jobs, arm=ArmIndex(1)):
        k = cmp.comparison
        ratio = micro.get(cmp.class_bytes)
        print(
            f"| {cmp.collective} | {cmp.class_bytes} | {k.pairs} | {k.speedup:.3f} | [{k.ci_low:.3f}, {k.ci_high:.3f}] "
            f"| {cmp.decision.value} | {f'{ratio:.3f}' if ratio else '-'} |"
        )


def tuning_agreement(out: Path) -> None:
    """Per size: the challenger table's row (or none) and the choices NCCL's TUNING lines name, all ranks."""
    log = out / "perf-tuning.log"
    if not log.exists():
        return
    rows = [
        line.split(",")
        for line in (out / "challenger.csv").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    seen: dict[int, list[str]] = {}
    for size, algo, proto, lo, hi in _TUNING.findall(log.read_text(encoding="utf-8", errors="replace")):
        seen.setdefault(int(size), []).append(f"{algo.lower()}/{proto.lower()} ch={int(hi) - int(lo) + 1}")
    print()
    print("| bytes | table row | NCCL TUNING lines (every rank, every call) | agrees |")
    print("|---|---|---|---|")
    for size, choices in sorted(seen.items()):
        row = next((r for r in rows if int(r[1]) <= size <= int(r[2])), None)
        want = f"{row[3]}/{row[4]}" if row else None
        named = sorted(set(choices))
        agree = "-" if want is None else ("yes" if all(c.startswith(want + " ") for c in choices) else "NO")
        print(f"| {size} | {want or 'none (NCCL decides)'} | {', '.join(named)} ({len(choices)} lines) | {agree} |")


def cost_per_call(out: Path) -> None:
    """Per size: all_reduce_perf's time with the profiler timing 1 call in SAMPLE over without, paired by round."""
    rounds = sorted(int(p.stem.rsplit("-", 1)[1]) for p in out.glob("cost-off-*.log"))
    runs = {}
    for r in rounds:
        try:
            runs[r] = (read_log(out / f"cost-off-{r}.log"), read_log(out / f"cost-on-{r}.log"))
        except (OSError, ValueError):
            continue  # a failed or missing run: its round is left out, and the count below says so
    if len(runs) < 2:
        return
    print()
    print(f"learning's cost per call, nccl-tests all_reduce without graphs, {len(runs)} rounds paired:")
    print("| bytes | off us (median) | on / off | 98 % CI |")
    print("|---|---|---|---|")
    for size in sorted(set.intersection(*(set(off) & set(on) for off, on in runs.values()))):
        off = [runs[r][0][size][0] for r in sorted(runs)]
        on = [runs[r][1][size][0] for r in sorted(runs)]
        c = statistics.compare(off, on)
        print(f"| {size} | {stats.median(off):.1f} | {1 / c.speedup:.4f} | [{1 / c.ci_high:.4f}, {1 / c.ci_low:.4f}] |")


def _micro(out: Path) -> dict[int, float]:
    """Size class -> geometric mean over rounds of nccl-tests' chosen-table time over the challenger's."""
    ratios: dict[int, list[float]] = {}
    for chosen in sorted(out.glob("perf-arm0-*.log")):
        challenger = chosen.with_name(chosen.name.replace("arm0", "arm1"))
        if not challenger.exists():
            continue
        a, b = read_log(chosen), read_log(challenger)
        for size in sorted(set(a) & set(b)):
            ratios.setdefault(size, []).append(a[size][0] / b[size][0])
    return {size: math.exp(stats.fmean(map(math.log, r))) for size, r in ratios.items()}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "summarize":
        print("usage: python -m benchmarks.one_gpu_learning summarize OUT", file=sys.stderr)
        return 2
    summarize(Path(argv[1]))
    cost_per_call(Path(argv[1]))
    tuning_agreement(Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
