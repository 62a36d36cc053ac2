"""The plugin's profiler: its host-side cost per collective, timing off, 1 in 64 and every call timed.

A small C driver dlopens the plugin as NCCL does, creates one communicator's context through
``ncclProfiler_v5`` and plays NCCL's events for each call (the collective's start and stop, and for a call
the plugin takes as a sample, a start, a stop time and a stop for each of its 8 channels), in alternating
rounds of the three settings. This is what the plugin's own functions cost the CPU per call; the kernels'
cost of NCCL's kernel events (NVIDIA/nccl#2355) and the cost inside NCCL need a GPU and are not measured here.
Target for the plugin's own part: under 50 ns per call at 1 in 64 (1 % of a 5 µs small collective).

Usage: ``python benchmarks/profiler_host_cost.py [--calls 1000000] [--rounds 9]``.
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

TARGET_NS = 50.0
SETTINGS = (("timing off", None), ("1 in 64", "64"), ("every call", "1"))

DRIVER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "nccl_profiler_abi.h"

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)level; (void)flags; (void)file; (void)line; (void)fmt;
}

int main(int argc, char** argv) {
  (void)argc;
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  const ncclProfiler_v5_t* p = (const ncclProfiler_v5_t*)dlsym(lib, "ncclProfiler_v5");
  long calls = atol(argv[2]);
  int mask = 0;
  void* ctx = NULL;
  p->init(&ctx, 0xabc, &mask, "bench", 1, 8, 0, logger);
  ncclProfilerEventDescr_v5_t coll, kernel;
  memset(&coll, 0, sizeof(coll));
  coll.type = ncclProfileColl;
  coll.coll.fields.func = "AllReduce";
  coll.coll.fields.datatype = "ncclBfloat16";
  coll.coll.fields.nChannels = 8;
  coll.coll.fields.algo = "RING";
  coll.coll.fields.proto = "SIMPLE";
  memset(&kernel, 0, sizeof(kernel));
  kernel.type = ncclProfileKernelCh;
  ncclProfilerEventStateArgs_t stop;
  memset(&stop, 0, sizeof(stop));
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < calls; i++) {
    coll.coll.fields.count = (size_t)1 << (7 + (i & 15)); /* 256 B .. 8 MiB of bf16 */
    void* h = NULL;
    p->startEvent(ctx, &h, &coll);
    if (h != NULL) p->stopEvent(h);
    for (int c = 0; h != NULL && c < 8; c++) {
      void* k = NULL;
      kernel.parentObj = h;
      kernel.kernelCh.channelId = (uint8_t)c;
      kernel.kernelCh.pTimer = 1000000ULL * (uint64_t)i;
      p->startEvent(ctx, &k, &kernel);
      stop.kernelCh.pTimer = kernel.kernelCh.pTimer + 5000 + (uint64_t)c;
      p->recordEventState(k, ncclProfilerKernelChStop, &stop);
      p->stopEvent(k);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  p->finalize(ctx);
  printf("%.3f\n", ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)calls);
  return 0;
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    sources = Path(build_plugin.__code__.co_filename).parent
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        library = build_plugin(scratch / "plugin").path
        (scratch / "driver.c").write_text(DRIVER)
        driver = scratch / "driver"
        compile_driver = [*find_compiler(os.environ), "-O2", "-I", str(sources), "-o", str(driver)]
        subprocess.run([*compile_driver, str(scratch / "driver.c"), "-ldl"], check=True)
        records = scratch / "records"
        records.mkdir()
        base = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_TUNE_")}
        times: dict[str, list[float]] = {name: [] for name, _ in SETTINGS}
        for round_ in range(args.rounds):
            order = SETTINGS if round_ % 2 == 0 else tuple(reversed(SETTINGS))
            for name, period in order:
                env = base if period is None else base | {"TOPO_TUNE_WORKLOAD_DIR": str(records)}
                env = env if period is None else env | {"TOPO_TUNE_TIMING_SAMPLE": period}
                out = subprocess.run(
                    [str(driver), str(library), str(args.calls)], env=env, capture_output=True, check=True
                )
                times[name].append(float(out.stdout))
        written = len(list(records.iterdir()))
    print(f"# profiler host cost, {args.calls} collectives per run, {args.rounds} rounds, 8 channels per call")
    print(f"# (load average {os.getloadavg()[0]:.1f} at the end; {written} timing records written)\n")
    print("| | ns per call (median) | min | max | over timing off (median of rounds) |")
    print("|---|---|---|---|---|")
    off = times["timing off"]
    for name, _ in SETTINGS:
        values = times[name]
        extra = statistics.median(v - o for v, o in zip(values, off, strict=True))
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} | {extra:.2f} |")
    sampled = statistics.median(v - o for v, o in zip(times["1 in 64"], off, strict=True))
    verdict = "ok" if sampled < TARGET_NS else "OVER"
    print(f"\n1 in 64 adds {sampled:.2f} ns per call on the host; target < {TARGET_NS:.0f} ns: {verdict}")


if __name__ == "__main__":
    main()
