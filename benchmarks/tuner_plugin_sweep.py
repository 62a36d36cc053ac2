"""Per-size times of the ``nccl`` backend's sweep with NCCL's defaults and with topo-tune's tuner plugin.

Runs all_reduce (out of place, 512 B .. 512 MiB by 4, one rank per GPU) through the agent's own executor in
four variants: NCCL's defaults; ``NCCL_MIN_CTAS=NCCL_MAX_CTAS=16`` and ``=4`` for every size (what one
environment value can do); and the plugin with a table that asks for 16 channels up to 1 MiB and 4 above
(what only a per-size table can do). If the plugin works, the table's times follow the 16-channel run at
small sizes and the 4-channel run at large ones. Every rank runs with ``NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=INIT,TUNING``; NCCL's ``AllReduce: N Bytes -> Algo A proto P channel{Lo..Hi}`` lines from
rank 0 are printed per size next to the times, with the plugin's own ``TUNER/TopoTune`` lines.

Usage: ``python benchmarks/tuner_plugin_sweep.py --gpus 2 [--keep-nccls-choice] --out report.md`` (needs a
C compiler and at least two GPUs: NCCL never consults a tuner for one-rank communicators).
Writes the report and rank 0's log of every variant next to it.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from benchmarks.nccl_harness_vs_bare import ENV, harness
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin import build_plugin, plugin_env

SWEEP = SizeSweep(512, 512 << 20, 4)
SPLIT = 1 << 20
DEBUG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,TUNING"}
CHOICE = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")


def table(nranks: int, *, keep_nccls_choice: bool = False) -> str:
    """16 channels up to 1 MiB, 4 above. With ``keep_nccls_choice`` the rows name no algorithm/protocol
    (``-1,-1``: NCCL keeps its own, the row sets channels only); otherwise each range lists NCCL's likely
    protocols on NVLink in order, since a row naming one NCCL ruled out is passed over for the next."""
    rows = ["# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"]
    if keep_nccls_choice:
        rows.append(f"allreduce,0,{SPLIT},-1,-1,16,1,{nranks}")
        rows.append(f"allreduce,{SPLIT + 1},17179869184,-1,-1,4,1,{nranks}")
        return "\n".join(rows) + "\n"
    for proto in ("ll", "ll128", "simple"):
        rows.append(f"allreduce,0,65536,ring,{proto},16,1,{nranks}")
    for proto in ("ll128", "ll", "simple"):
        rows.append(f"allreduce,65537,{SPLIT},ring,{proto},16,1,{nranks}")
    for proto in ("simple", "ll128"):
        rows.append(f"allreduce,{SPLIT + 1},17179869184,ring,{proto},4,1,{nranks}")
    return "\n".join(rows) + "\n"


def choices(log: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for m in CHOICE.finditer(log):
        out.setdefault(int(m[1]), f"{m[2]}/{m[3]} ch {m[4]}..{m[5]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--keep-nccls-choice", action="store_true", help="rows -1,-1: set channels only")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="topotune-sweep-"))
    built = build_plugin(work / "lib")
    table_path = work / "config" / "tuner-table.csv"
    table_path.parent.mkdir()
    text = table(args.gpus, keep_nccls_choice=args.keep_nccls_choice)
    table_path.write_text(text)
    policy = EnvPolicy(config_dirs=(table_path.parent,), plugin_dirs=(built.path.parent,))
    variants = {
        "defaults": {},
        "ctas16": {"NCCL_MIN_CTAS": "16", "NCCL_MAX_CTAS": "16"},
        "ctas4": {"NCCL_MIN_CTAS": "4", "NCCL_MAX_CTAS": "4"},
        "plugin": plugin_env(table_path, built.path),
    }
    times: dict[str, dict[int, float]] = {}
    picked: dict[str, dict[int, str]] = {}
    tuner_lines: list[str] = []
    for name, extra in variants.items():
        jobs = work / "jobs"
        _, rows, wall, _ = harness(
            Collective.ALL_REDUCE,
            SWEEP,
            gpus=args.gpus,
            iters=args.iters,
            warmup=args.warmup,
            job_id=f"sweep-{name}",
            placements=(False,),
            env={**ENV, **DEBUG, **extra},
            policy=policy,
            work_dir=jobs,
        )
        times[name] = {m.bytes: m.time_us for m in rows}
        log = (jobs / f"sweep-{name}" / "rank-0" / "stderr.log").read_text(errors="replace")
        (args.out.parent / f"{args.out.stem}-{name}-rank0.log").write_text(log)
        picked[name] = choices(log)
        if name == "plugin":
            tuner_lines = [line.split("NCCL ", 1)[-1] for line in log.splitlines() if "TUNER/" in line]
        print(f"{name}: {wall:.1f} s", file=sys.stderr)
    out = ["# all_reduce per size: NCCL defaults, one CTA count for all sizes, and the plugin's per-size table", ""]
    out += [f"Table (`NCCL_TUNER_CONFIG_FILE`), {args.gpus} ranks on one node:", "", "```", text, "```", ""]
    out += [
        "Out-of-place time in us (slowest rank), and NCCL's own choice from rank 0's TUNING log:",
        "",
        "| bytes | defaults | CTAS=16 | CTAS=4 | plugin table | table asks | plugin/CTAS=16 | plugin/CTAS=4 |"
        " NCCL default choice | with the plugin |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in sorted(times["defaults"]):
        t = {n: times[n][size] for n in variants}
        ask = "16 ch" if size <= SPLIT else "4 ch"
        out.append(
            f"| {size} | {t['defaults']:.1f} | {t['ctas16']:.1f} | {t['ctas4']:.1f} | {t['plugin']:.1f} | {ask} | "
            f"{t['plugin'] / t['ctas16']:.3f} | {t['plugin'] / t['ctas4']:.3f} | "
            f"{picked['defaults'].get(size, '?')} | {picked['plugin'].get(size, '?')} |"
        )
    out += ["", "The plugin's log lines (rank 0):", "", "```", *tuner_lines, "```", ""]
    text = "\n".join(out)
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
