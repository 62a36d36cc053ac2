"""Memory and time benchmark: a PyTorch profiler trace's import at 1e5, 1e6 and 1e7 events.

Each trace is generated, written streaming, in a temporary directory: half its events are NCCL
``record_param_comms`` CPU ops and half their kernels, all_reduce over 16 sizes, as a profiler writes them
(``write_trace``). Each import runs ``read_workload_file`` in a fresh process, which reports its peak
resident memory (``VmHWM``) and the time the import took; the same process's memory before the import
(the interpreter and topo-tune's modules) is the baseline the import's growth is measured from.
``docs/workload.md`` promises memory bounded by the largest event, whatever the number of events.

Usage: python benchmarks/trace_import.py [--events 100000 1000000 10000000]
Prints one table row per trace. Target: 1e6 events under 200 MB peak (``tests/workload/
test_trace_streaming.py`` checks it), and the growth from 1e5 to 1e7 events within a few MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

SIZES = tuple(1 << k for k in range(8, 24))
"""Elements per call: 16 sizes, so the import adds up 16 (collective, size) rows whatever the events."""

_CPU_OP = (
    '{{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 824, "tid": 852, "ts": {ts}.5, '
    '"dur": 9.5, "args": {{"External id": {id}, "Collective name": "allreduce", "dtype": "Float", '
    '"In msg nelems": {n}, "Out msg nelems": {n}, "Group size": 8, "Process Group Name": "0"}}}}'
)
_KERNEL = (
    '{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7, '
    '"ts": {ts}.5, "dur": 20.25, "args": {{"External id": {id}, "Collective name": "allreduce", '
    '"dtype": "Float", "In msg nelems": {n}, "Out msg nelems": {n}, "Group size": 8, "stream": 7}}}}'
)

_CHILD = """
import sys, time
from pathlib import Path
from topo_tune.workload.file_kinds import read_workload_file
def high_water_kib():
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child of a large process inherits its figure.
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
before = high_water_kib()
start = time.perf_counter()
calls = read_workload_file(Path(sys.argv[1]))
seconds = time.perf_counter() - start
print(before, high_water_kib(), seconds, sum(s.calls for s in calls.calls.values()))
"""


def write_trace(out: TextIO, events: int) -> int:
    """A rank-0 trace of ``events`` events (a CPU op and its kernel per call, and one closing instant event);
    returns the calls.

    Written as one block of every size repeated (timestamps repeat too; the import does not read them), so
    generating 1e7 events costs seconds, not the minutes formatting each event would."""
    out.write(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 8}})[:-1])
    out.write(', "traceEvents": [\n')
    calls = events // 2
    pairs = [
        _CPU_OP.format(ts=10 * i, id=i, n=n) + ",\n" + _KERNEL.format(ts=10 * i + 3, id=i, n=n)
        for i, n in enumerate(SIZES)
    ]
    block = ",\n".join(pairs) + ",\n"
    full, rest = divmod(calls, len(SIZES))
    for start in range(0, full, 1000):
        out.write(block * min(1000, full - start))
    out.write("".join(pair + ",\n" for pair in pairs[:rest]))
    out.write('{"ph": "i", "name": "end", "ts": 0}\n], "traceName": "generated"}\n')
    return calls


def measure(path: Path, *, env: dict[str, str] | None = None) -> tuple[float, float, float, float]:
    """(baseline MiB, peak MiB, seconds, calls counted) of one import in a fresh process."""
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=True, env=env
    )
    before_kib, peak_kib, seconds, calls = child.stdout.split()
    return int(before_kib) / 1024, int(peak_kib) / 1024, float(seconds), float(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    args = parser.parse_args()
    print(f"# trace import: a generated PyTorch trace (NCCL all_reduce, {len(SIZES)} sizes), one process each")
    print(f"# (load average {os.getloadavg()[0]:.1f} at the start)")
    print()
    print("| events | file MB | baseline MiB | peak MiB | growth MiB | import s | events/s | calls counted |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for events in args.events:
            path = Path(scratch) / f"trace-{events}.json"
            with path.open("w", encoding="utf-8") as out:
                calls = write_trace(out, events)
            size_mb = path.stat().st_size / 1e6
            baseline, peak, seconds, counted = measure(path)
            path.unlink()
            assert counted == calls, f"{counted} calls counted, {calls} written"
            print(
                f"| {events:,} | {size_mb:,.0f} | {baseline:.0f} | {peak:.0f} | {peak - baseline:.0f} | "
                f"{seconds:.1f} | {events / seconds:,.0f} | {int(counted):,} |",
                flush=True,
            )
    print(f"\n# load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
