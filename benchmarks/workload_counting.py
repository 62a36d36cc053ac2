"""The tuner plugin's workload counting: its cost per getCollInfo call (target: under 50 ns per call).

A small C driver dlopens the plugin as NCCL does, creates one communicator's context through
``ncclTunerPlugin_v5`` and times ``getCollInfo`` over a spread of sizes (and an NCCL-like cost table that the
plugin's empty table leaves alone), with ``TOPO_TUNE_WORKLOAD_DIR`` unset and set, in alternating rounds; the
overhead is the median over rounds of (counting - not counting) per call. Timing in C keeps the figure
free of Python's call cost (about a microsecond through ctypes, twenty times the target).

Usage: ``python benchmarks/workload_counting.py [--calls 2000000] [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from topo_tune.plugin import build_plugin
from topo_tune.plugin.build import find_compiler
from topo_tune.plugin.job_env import WORKLOAD_ENV

TARGET_NS = 50.0

DRIVER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*initFn)(void**, uint64_t, size_t, size_t, void*, void*, void*);
typedef int (*collFn)(void*, int, size_t, int, float**, int, int, int, int*);
typedef int (*finFn)(void*);
typedef struct { const char* name; initFn init; collFn getCollInfo; finFn finalize; } tuner;

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)level; (void)flags; (void)file; (void)line; (void)fmt;
}

int main(int argc, char** argv) {
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  const tuner* t = (const tuner*)dlsym(lib, "ncclTunerPlugin_v5");
  long calls = atol(argv[2]);
  void* ctx = NULL;
  t->init(&ctx, 1, 16, 2, (void*)logger, NULL, NULL);
  float table[7 * 3];
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < calls; i++) {
    for (int c = 0; c < 21; c++) table[c] = 10.0f + (float)c;
    int channels = 0;
    size_t bytes = (size_t)1 << (8 + (i & 15)); /* 256 B .. 8 MiB */
    t->getCollInfo(ctx, 4, bytes, 1, (float**)table, 7, 3, 0, &channels);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  t->finalize(ctx);
  printf("%.3f\n", ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)calls);
  return 0;
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        library = build_plugin(scratch / "plugin").path
        (scratch / "driver.c").write_text(DRIVER)
        compiler = find_compiler(os.environ)
        driver = scratch / "driver"
        subprocess.run([*compiler, "-O2", "-o", str(driver), str(scratch / "driver.c"), "-ldl"], check=True)
        counts = scratch / "counts"
        counts.mkdir()
        table = scratch / "empty-table.csv"
        table.write_text("")
        base = {k: v for k, v in os.environ.items() if k != WORKLOAD_ENV} | {"NCCL_TUNER_CONFIG_FILE": str(table)}
        off: list[float] = []
        on: list[float] = []
        for round_ in range(args.rounds):
            for counting in (round_ % 2 == 0, round_ % 2 == 1):
                env = base | ({WORKLOAD_ENV: str(counts)} if counting else {})
                command = [str(driver), str(library), str(args.calls)]
                out = subprocess.run(command, env=env, capture_output=True, check=True)
                (on if counting else off).append(float(out.stdout))
        written = len(list(counts.iterdir()))
    deltas = [b - a for a, b in zip(off, on, strict=True)]
    overhead = statistics.median(deltas)
    print(f"# tuner plugin workload counting, {args.calls} getCollInfo calls per run, {args.rounds} rounds")
    print(f"# (load average {os.getloadavg()[0]:.1f} at the end; {written} count files written)\n")
    print("| | ns per call (median) | min | max |")
    print("|---|---|---|---|")
    print(f"| not counting | {statistics.median(off):.2f} | {min(off):.2f} | {max(off):.2f} |")
    print(f"| counting | {statistics.median(on):.2f} | {min(on):.2f} | {max(on):.2f} |")
    verdict = "ok" if overhead < TARGET_NS else "OVER"
    print(f"| overhead (median of paired rounds) | {overhead:.2f} | {min(deltas):.2f} | {max(deltas):.2f} |")
    print(f"\ncounting overhead {overhead:.2f} ns per call; target < {TARGET_NS:.0f} ns: {verdict}")


if __name__ == "__main__":
    main()
