/*
 * Plays NCCL's part for topo-tune's profiler plugin with synthetic events, as NCCL 2.30 sends them: a
 * collective event per call (started, then stopped once enqueued), then per channel a kernel event started
 * with the GPU start time, its stop time recorded, and stopped. Used by test_profiler_timing.py.
 *
 *   profiler_driver LIBRARY VERSION CALLS [COMMUNICATORS]
 *
 * Call n is an all_reduce of 256 float32 (1 KiB, ring/LL, 2 channels, 5000 ns per channel) when n is even,
 * an all_gather of 1 MiB (ring/SIMPLE, 4 channels, 80000 ns) when odd; odd calls deliver their kernel events
 * before the collective's stop, even ones after (both orders happen in NCCL). Channel c starts 10*c ns after
 * the first. Prints, per call, whether NCCL's mask enabled kernel events when the call was made and whether
 * the plugin took the call as a sample, then whether a late kernel event of a finished sample was refused.
 * With several communicators (at most 4, sharing NCCL's one mask) each makes CALLS calls, interleaved.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_profiler_abi.h"

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  va_list args;
  va_start(args, fmt);
  fprintf(stderr, "log %d: ", (int)level);
  vfprintf(stderr, fmt, args);
  fputc('\n', stderr);
  va_end(args);
}

typedef struct {
  int version;
  const ncclProfiler_v5_t* v5;
  const ncclProfiler_v4_t* v4;
} Plugin;

static void* start(const Plugin* p, void* ctx, uint64_t type, void* parent, const ncclProfilerCollDescr_t* coll,
                   uint64_t pTimer, uint8_t channel) {
  void* handle = NULL;
  if (p->version == 4) {
    ncclProfilerEventDescr_v4_t d;
    memset(&d, 0, sizeof(d));
    d.type = (uint8_t)type;
    d.parentObj = parent;
    if (coll != NULL) d.coll = *coll;
    if (coll == NULL) d.kernelCh.channelId = channel, d.kernelCh.pTimer = pTimer;
    p->v4->startEvent(ctx, &handle, &d);
  } else {
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = type;
    d.parentObj = parent;
    if (coll != NULL) d.coll.fields = *coll;
    if (coll == NULL) d.kernelCh.channelId = channel, d.kernelCh.pTimer = pTimer;
    p->v5->startEvent(ctx, &handle, &d);
  }
  return handle;
}

static void kernels(const Plugin* p, void* ctx, void* coll, int channels, uint64_t t0, uint64_t duration) {
  for (int c = 0; c < channels; c++) {
    void* k = start(p, ctx, ncclProfileKernelCh, coll, NULL, t0 + 10 * (uint64_t)c, (uint8_t)c);
    ncclProfilerEventStateArgs_t args;
    memset(&args, 0, sizeof(args));
    args.kernelCh.pTimer = t0 + 10 * (uint64_t)c + duration;
    if (k != NULL) {
      p->v5->recordEventState(k, ncclProfilerKernelChStop, &args);
      p->v5->stopEvent(k);
    }
  }
}

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return 3;
  Plugin p = {atoi(argv[2]), (const ncclProfiler_v5_t*)dlsym(lib, "ncclProfiler_v5"),
              (const ncclProfiler_v4_t*)dlsym(lib, "ncclProfiler_v4")};
  int calls = atoi(argv[3]);
  int comms = argc == 5 ? atoi(argv[4]) : 1;
  if (comms < 1 || comms > 4) return 2;
  int mask = 0; /* NCCL's one activation mask, handed to every communicator's init */
  void* ctx[4] = {NULL, NULL, NULL, NULL};
  for (int j = 0; j < comms; j++) {
    if (p.version == 4) {
      p.v4->init(&ctx[j], &mask, "comm", 0xabcULL + (uint64_t)j, 1, 2, 1, logger);
    } else {
      p.v5->init(&ctx[j], 0xabcULL + (uint64_t)j, &mask, "comm", 1, 2, 1, logger);
    }
  }
  printf("context %d coll %d\n", ctx[0] != NULL, (mask & ncclProfileColl) != 0);
  void* last = NULL;
  /* With several communicators their calls interleave: call n of communicator j is step n * comms + j. */
  for (int step = 0; step < calls * comms; step++) {
    int n = step / comms, j = step % comms;
    int even = n % 2 == 0;
    ncclProfilerCollDescr_t coll;
    memset(&coll, 0, sizeof(coll));
    coll.seqNumber = (uint64_t)n / 2;
    coll.func = even ? "AllReduce" : "AllGather";
    coll.count = even ? 256 : 1048576;
    coll.datatype = even ? "ncclFloat32" : "ncclInt8";
    coll.nChannels = even ? 2 : 4;
    coll.algo = "RING";
    coll.proto = even ? "LL" : "SIMPLE";
    int kernelOn = (mask & ncclProfileKernelCh) != 0;
    void* h = start(&p, ctx[j], ncclProfileColl, NULL, &coll, 0, 0);
    uint64_t t0 = 1000000000ULL + 1000000ULL * (uint64_t)step;
    uint64_t duration = even ? 5000 : 80000;
    if (!even && h != NULL) kernels(&p, ctx[j], h, coll.nChannels, t0, duration);
    if (h != NULL) p.v5->stopEvent(h);
    if (even && h != NULL) kernels(&p, ctx[j], h, coll.nChannels, t0, duration);
    if (comms == 1) {
      printf("call %d kernel %d sampled %d\n", n, kernelOn, h != NULL);
    } else {
      printf("comm %d call %d kernel %d sampled %d\n", j, n, kernelOn, h != NULL);
    }
    if (h != NULL && j == 0) last = h;
  }
  if (last != NULL) {
    void* late = start(&p, ctx[0], ncclProfileKernelCh, last, NULL, 1, 0);
    printf("late refused %d\n", late == NULL);
  }
  for (int j = 0; j < comms; j++) p.v5->finalize(ctx[j]);
  printf("mask kernel after finalize %d\n", (mask & ncclProfileKernelCh) != 0);
  return 0;
}
