"""The tuner plugin's cost in nccl-tests: a table from multi_gpu_job.sh's interleaved perf logs.

``python benchmarks/plugin_cost.py JOB_OUT`` reads ``perf-{off,empty,count}-<round>.log`` (all_reduce_perf, plugin
not loaded / loaded with an empty table / loaded and counting) and prints, per size, each arm's median time over
the rounds (both placements), its ratio to the unloaded arm of the same round, and the unloaded arm's own spread
across rounds (the noise floor). NCCL's TUNING lines in the empty arm's log cut into the rows; they are removed
before the rows are read.

Non-goals: running nccl-tests (the harness does), any claim about links between GPUs.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from pathlib import Path

ARMS = ("off", "empty", "count")
_INFO = re.compile(r"[A-Za-z][\w.-]*:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN)[^\n]*\n")
_ROW = re.compile(r"^\s+(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+\d+\s+([\d.]+)", re.M)


def read_log(path: Path) -> dict[int, tuple[float, float]]:
    """size -> (out-of-place us, in-place us)."""
    text = _INFO.sub("", path.read_text(encoding="utf-8", errors="replace"))
    rows = {int(size): (float(out), float(inp)) for size, out, inp in _ROW.findall(text)}
    if not rows:
        raise ValueError(f"{path}: no all_reduce_perf rows")
    return rows


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    rounds = sorted(int(p.stem.rsplit("-", 1)[1]) for p in out.glob("perf-off-*.log"))
    runs = {(arm, r): read_log(out / f"perf-{arm}-{r}.log") for arm in ARMS for r in rounds}
    sizes = sorted(runs[("off", rounds[0])])
    print(
        f"| bytes | off us (median of {len(rounds)} rounds x 2 placements) | empty / off | count / off | off spread |"
    )
    print("|---|---|---|---|---|")
    logs: dict[str, list[float]] = {"empty": [], "count": []}
    for size in sizes:
        ratios = {}
        for arm in ("empty", "count"):
            pairs = [math.log(runs[(arm, r)][size][k] / runs[("off", r)][size][k]) for r in rounds for k in (0, 1)]
            logs[arm] += pairs
            ratios[arm] = math.exp(statistics.fmean(pairs))
        off = [runs[("off", r)][size][k] for r in rounds for k in (0, 1)]
        print(
            f"| {size} | {statistics.median(off):.2f} | {ratios['empty']:.4f} | {ratios['count']:.4f} "
            f"| {max(off) / min(off):.4f} |"
        )
    for arm, values in logs.items():
        print(f"{arm} / off, all sizes (geometric mean of same-round ratios): {math.exp(statistics.fmean(values)):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
