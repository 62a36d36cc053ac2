/*
 * topo-tune's NCCL profiler plugin, in the same library as its tuner plugin (libnccl-tuner-topotune.so).
 *
 * Purpose: time, inside real jobs, the collectives the tuner chose for, from NCCL's own kernel events, so
 * that production jobs can compare tuner tables (docs/learning.md). NCCL loads it with NCCL_PROFILER_PLUGIN
 * naming this library. It records only with TOPO_TUNE_WORKLOAD_DIR naming a directory (the tuner's workload
 * counts go there too) and TOPO_TUNE_TIMING_SAMPLE=K (a positive integer): otherwise every communicator gets
 * no context and every event is ignored.
 *
 * Per communicator, in fixed arrays allocated at init, per (collective, size class, algorithm/protocol NCCL
 * launched): every call (the record of what ran, which the ranks of a communicator must agree on), and of
 * the sampled calls their GPU time (first kernel channel start to last channel stop, GPU globaltimer ns):
 * count, sum, min, max, and the sum and sum of squares of ln(ns) (the proof's statistics work on log times).
 * Size class c holds (2^(c-1), 2^c] bytes, as the workload counts do.
 *
 * Sampling: call n of a communicator (its n-th collective event, counted from 0) is timed when n % K == 0.
 * Every rank of a communicator enqueues the same collectives in the same order, so every rank times the same
 * calls. Kernel events cost the kernel work on every call they are enabled for (NVIDIA/nccl#2355), so the
 * KernelCh bit of NCCL's activation mask is set only while some communicator's next call is a sampled one:
 * NCCL copies the mask into a call when the call is made, and a call's collective event reaches the plugin
 * before the next call is made (a communicator is used by one thread at a time), so setting the bit at call
 * n-1's event enables it for call n. NCCL keeps one mask per process: with several communicators busy at
 * once an unsampled call may be enqueued with the bit on (it costs, its events are ignored), never the
 * other way round while the sampled communicator holds it. Calls inside one ncclGroupStart/End are all made
 * before any of their collective events arrive, so there the bit may land on a neighbour of the sampled call:
 * the sample then never finishes and is counted as unfinished, never given a wrong time.
 *
 * Hot path: no lock and no allocation. Event handles are not pointers but tagged integers (kind, context
 * slot, sample slot, generation), so a late or repeated kernel event (CUDA-graph replays of a captured call)
 * that names a finished sample is recognised by its generation and ignored. A sample is finished when its
 * collective event and the kernel stop of each of its nChannels channels have arrived; the 64 sample slots
 * are reused round-robin, and a sample still unfinished when its slot comes round again is counted as
 * unfinished in the record (so a wrong assumption about the events shows in the file, not as a wrong time).
 *
 * Output at finalize, a new file topo-tune-timing.<host>.<pid>.<n>.txt in that directory (O_EXCL,
 * O_NOFOLLOW):
 *   topo-tune timing record 1
 *   process <host>:<pid> comm <commId hex> rank <r> nranks <n> nnodes <n> sample <K> arm <arm>
 *   unfinished <n> overflow <n>
 *   <collective> <class max bytes> <algorithm>/<protocol> <calls> <timed> <sum ns> <min ns> <max ns> <sum ln ns>
 *     <sum ln^2 ns>
 * with <arm> from TOPO_TUNE_LEARNING_ARM (digits; "-" when unset) and "overflow" the calls of a
 * (collective, size class) past its first four algorithm/protocol pairs.
 *
 * Non-goals: point-to-point and copy-engine events, proxy and network events, the v1-v3 interfaces (no
 * kernel events), and deciding anything from the record (the controller does).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"
#include "topotune_record_file.h"

#define TP_EXPORT __attribute__((visibility("default")))
#define TP_PLUGIN_NAME "TopoTune"
#define TP_DIR_ENV "TOPO_TUNE_WORKLOAD_DIR"
#define TP_SAMPLE_ENV "TOPO_TUNE_TIMING_SAMPLE"
#define TP_ARM_ENV "TOPO_TUNE_LEARNING_ARM"
#define TP_MAGIC "topo-tune timing record 1\n"
#define TP_FUNCS 6 /* the five collectives a tuner is asked about, then every other function */
#define TP_CLASSES 64
#define TP_WAYS 4      /* algorithm/protocol pairs kept per (collective, size class) */
#define TP_SLOTS 64    /* samples in flight per communicator */
#define TP_CONTEXTS 256 /* communicators per process that can record at once */
#define TP_ALGOS 8      /* NCCL's seven algorithms, then "other" */
#define TP_PROTOS 4     /* NCCL's three protocols, then "other" */
#define TP_KIND_COLL 1u
#define TP_KIND_KERNEL 2u

typedef struct {
  uint64_t calls;
  uint64_t timed;
  uint64_t sumNs;
  uint64_t minNs;
  uint64_t maxNs;
  double sumLog;
  double sumSqLog;
} tpCell;

typedef struct {
  int key; /* 0: free; else 1 + algorithm * TP_PROTOS + protocol */
  tpCell cell;
} tpWay;

typedef struct {
  uint32_t generation; /* bumped when the sample finishes or its slot is reused */
  int pending;         /* the collective's stop and one kernel stop per channel still to come */
  int cell;            /* flat index of the (function, class, way) it adds to; -1: none */
  uint64_t startNs;    /* earliest kernel channel start */
  uint64_t stopNs;     /* latest kernel channel stop */
} tpSample;

/* NCCL passes its names as the same string constants every call: a pointer seen before needs no strcmp. */
typedef struct {
  const char* name;
  int index;
} tpNameCache;

typedef struct {
  int index; /* in tpContexts */
  tpNameCache funcSeen, typeSeen, algoSeen, protoSeen; /* touched only by the thread enqueuing its calls */
  uint64_t commId;
  int rank;
  int nRanks;
  int nNodes;
  uint64_t sample;
  uint64_t calls;
  uint64_t untilSample; /* calls left before the next sampled one: (K - n % K) % K, kept without a division */
  int armed;            /* this communicator's next call is a sampled one */
  uint64_t unfinished;
  uint64_t overflow;
  int dir;
  ncclDebugLogger_t log;
  tpSample samples[TP_SLOTS];
  tpWay ways[TP_FUNCS][TP_CLASSES][TP_WAYS];
} tpContext;

static tpContext* tpContexts[TP_CONTEXTS];
static int* tpMask;    /* NCCL's activation mask (one per process in the NCCL versions read) */
static int tpArmed;    /* communicators whose next call is sampled */

static void tpLog(ncclDebugLogger_t log, ncclDebugLogLevel level, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void tpLog(ncclDebugLogger_t log, ncclDebugLogLevel level, int line, const char* fmt, ...) {
  if (log == NULL) return;
  char message[512];
  int offset = snprintf(message, sizeof(message), "PROFILER/" TP_PLUGIN_NAME ": ");
  va_list args;
  va_start(args, fmt);
  vsnprintf(message + offset, sizeof(message) - (size_t)offset, fmt, args);
  va_end(args);
  log(level, NCCL_INIT, "topotune_profiler.c", line, "%s", message);
}

/* A handle: kind (2 bits), context (8), sample slot (6), generation (32); never 0. */
static inline void* tpHandle(unsigned kind, int context, int slot, uint32_t generation) {
  uint64_t h = ((uint64_t)generation << 16) | ((uint64_t)(unsigned)slot << 10) | ((uint64_t)(unsigned)context << 2) | kind;
  return (void*)(uintptr_t)h;
}

/* The live sample a handle names, or NULL when the handle is stale or not ours. */
static inline tpSample* tpSampleOf(void* handle, unsigned* kind, tpContext** owner) {
  uint64_t h = (uint64_t)(uintptr_t)handle;
  *kind = (unsigned)(h & 3u);
  tpContext* ctx = __atomic_load_n(&tpContexts[(h >> 2) & (TP_CONTEXTS - 1)], __ATOMIC_ACQUIRE);
  if (ctx == NULL || (*kind != TP_KIND_COLL && *kind != TP_KIND_KERNEL)) return NULL;
  tpSample* s = &ctx->samples[(h >> 10) & (TP_SLOTS - 1)];
  if (__atomic_load_n(&s->generation, __ATOMIC_ACQUIRE) != (uint32_t)(h >> 16)) return NULL;
  *owner = ctx;
  return s;
}

static int tpIndexOf(const char* name, const char* const* names, int other) {
  if (name == NULL) return other;
  for (int i = 0; names[i] != NULL; i++) {
    if (strcmp(name, names[i]) == 0) return i;
  }
  return other;
}

/* NCCL's own spellings (ncclFuncToString, ncclAlgoToString, ncclProtoToString), in its enum order. */
static const char* const kFuncs[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", NULL};
static const char* const kFuncNames[TP_FUNCS] = {"broadcast", "reduce",    "allgather",
                                                 "reducescatter", "allreduce", "other_function"};
static const char* const kAlgos[] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT", NULL};
static const char* const kAlgoNames[TP_ALGOS] = {"tree", "ring", "collnet_direct", "collnet_chain",
                                                 "nvls", "nvls_tree", "pat", "other"};
static const char* const kProtos[] = {"LL", "LL128", "SIMPLE", NULL};
static const char* const kProtoNames[TP_PROTOS] = {"ll", "ll128", "simple", "other"};

static int tpCachedIndex(tpNameCache* seen, const char* name, const char* const* names, int other) {
  if (name != NULL && name == seen->name) return seen->index;
  int index = tpIndexOf(name, names, other);
  seen->name = name;
  seen->index = index;
  return index;
}

static const char* const kTypes[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",    "ncclUint32",
                                     "ncclInt64",   "ncclUint64",  "ncclFloat16",  "ncclFloat32",
                                     "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2", NULL};
static const size_t kTypeSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1, 1 /* unknown: count as bytes */};

static inline int tpSizeClass(uint64_t nBytes) {
  if (nBytes <= 1) return 0;
  int c = 64 - __builtin_clzll(nBytes - 1);
  return c < TP_CLASSES ? c : TP_CLASSES - 1;
}

/* The way of (function, class) for this algorithm/protocol, claimed on first use; -1 when all are taken. */
static int tpWayOf(tpContext* ctx, int f, int c, int key) {
  for (int w = 0; w < TP_WAYS; w++) {
    int* slot = &ctx->ways[f][c][w].key;
    int seen = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (seen == 0) {
      int expected = 0;
      if (__atomic_compare_exchange_n(slot, &expected, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return w;
      seen = expected;
    }
    if (seen == key) return w;
  }
  return -1;
}

/* A lock-free add to a double: the generic builtins compare and swap its 8 bytes. */
static void tpAddDouble(double* target, double value) {
  double seen;
  __atomic_load(target, &seen, __ATOMIC_RELAXED);
  double sum = seen + value;
  while (!__atomic_compare_exchange(target, &seen, &sum, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) sum = seen + value;
}

static void tpMin(uint64_t* target, uint64_t value) {
  uint64_t seen = __atomic_load_n(target, __ATOMIC_RELAXED);
  while (value < seen && !__atomic_compare_exchange_n(target, &seen, value, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static void tpMax(uint64_t* target, uint64_t value) {
  uint64_t seen = __atomic_load_n(target, __ATOMIC_RELAXED);
  while (value > seen && !__atomic_compare_exchange_n(target, &seen, value, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

/* Sets or clears the KernelCh bit by whether any communicator's next call is sampled. */
static void tpSetArmed(tpContext* ctx, int armed) {
  if (ctx->armed == armed) return;
  ctx->armed = armed;
  int now = __atomic_add_fetch(&tpArmed, armed ? 1 : -1, __ATOMIC_ACQ_REL);
  if (tpMask == NULL) return;
  if (now > 0) {
    __atomic_fetch_or(tpMask, ncclProfileKernelCh, __ATOMIC_RELAXED);
  } else {
    __atomic_fetch_and(tpMask, ~ncclProfileKernelCh, __ATOMIC_RELAXED);
  }
}

static void tpFinish(tpContext* ctx, tpSample* s, uint32_t generation) {
  if (s->cell >= 0 && s->stopNs > s->startNs && s->startNs != UINT64_MAX) {
    tpCell* cell = &((tpWay*)ctx->ways)[s->cell].cell;
    uint64_t ns = s->stopNs - s->startNs;
    double ln = log((double)ns);
    __atomic_fetch_add(&cell->timed, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&cell->sumNs, ns, __ATOMIC_RELAXED);
    tpMin(&cell->minNs, ns);
    tpMax(&cell->maxNs, ns);
    tpAddDouble(&cell->sumLog, ln);
    tpAddDouble(&cell->sumSqLog, ln * ln);
  }
  /* Only the caller that brought pending to 0 gets here; later events of this sample see a new generation. */
  __atomic_compare_exchange_n(&s->generation, &generation, generation + 1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

static void tpRelease(tpContext* ctx, tpSample* s, uint32_t generation) {
  if (__atomic_sub_fetch(&s->pending, 1, __ATOMIC_ACQ_REL) == 0) tpFinish(ctx, s, generation);
}

static ncclResult_t tpStartColl(tpContext* ctx, void** eHandle, const ncclProfilerCollDescr_t* coll) {
  int f = tpCachedIndex(&ctx->funcSeen, coll->func, kFuncs, TP_FUNCS - 1);
  size_t typeSize = kTypeSizes[tpCachedIndex(&ctx->typeSeen, coll->datatype, kTypes, 12)];
  int c = tpSizeClass((uint64_t)coll->count * typeSize);
  int key = 1 + tpCachedIndex(&ctx->algoSeen, coll->algo, kAlgos, TP_ALGOS - 1) * TP_PROTOS +
            tpCachedIndex(&ctx->protoSeen, coll->proto, kProtos, TP_PROTOS - 1);
  int w = tpWayOf(ctx, f, c, key);
  if (w < 0) {
    __atomic_fetch_add(&ctx->overflow, 1, __ATOMIC_RELAXED);
  } else {
    __atomic_fetch_add(&ctx->ways[f][c][w].cell.calls, 1, __ATOMIC_RELAXED);
  }
  uint64_t n = __atomic_fetch_add(&ctx->calls, 1, __ATOMIC_RELAXED);
  int sampled = ctx->armed;
  ctx->untilSample = ctx->untilSample == 0 ? ctx->sample - 1 : ctx->untilSample - 1;
  tpSetArmed(ctx, ctx->untilSample == 0); /* the same as (n + 1) % K == 0 */
  if (!sampled) return ncclSuccess;
  int slot = (int)((n / ctx->sample) % TP_SLOTS);
  tpSample* s = &ctx->samples[slot];
  /* A slot whose sample never finished is taken over: a new generation ignores its late events. */
  if (__atomic_load_n(&s->pending, __ATOMIC_ACQUIRE) > 0) __atomic_fetch_add(&ctx->unfinished, 1, __ATOMIC_RELAXED);
  uint32_t generation = __atomic_add_fetch(&s->generation, 1, __ATOMIC_ACQ_REL);
  s->cell = w < 0 ? -1 : (f * TP_CLASSES + c) * TP_WAYS + w;
  __atomic_store_n(&s->startNs, UINT64_MAX, __ATOMIC_RELAXED);
  __atomic_store_n(&s->stopNs, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&s->pending, 1 + (int)coll->nChannels, __ATOMIC_RELEASE);
  *eHandle = tpHandle(TP_KIND_COLL, ctx->index, slot, generation);
  return ncclSuccess;
}

static ncclResult_t tpStartEvent(void* context, void** eHandle, uint64_t type, void* parentObj,
                                 const ncclProfilerCollDescr_t* coll, const ncclProfilerKernelChDescr_t* kernel) {
  *eHandle = NULL;
  tpContext* ctx = (tpContext*)context;
  if (ctx == NULL) return ncclSuccess;
  if (type == ncclProfileColl) return tpStartColl(ctx, eHandle, coll);
  if (type != ncclProfileKernelCh || parentObj == NULL) return ncclSuccess;
  unsigned kind = 0;
  tpContext* owner = NULL;
  tpSample* s = tpSampleOf(parentObj, &kind, &owner);
  if (s == NULL || kind != TP_KIND_COLL) return ncclSuccess;
  tpMin(&s->startNs, kernel->pTimer);
  uint64_t h = (uint64_t)(uintptr_t)parentObj;
  *eHandle = tpHandle(TP_KIND_KERNEL, (int)((h >> 2) & (TP_CONTEXTS - 1)), (int)((h >> 10) & (TP_SLOTS - 1)),
                      (uint32_t)(h >> 16));
  return ncclSuccess;
}

static ncclResult_t tpStartEventV5(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* d) {
  if (eHandle == NULL || d == NULL) return ncclSuccess;
  return tpStartEvent(context, eHandle, d->type, d->parentObj, &d->coll.fields, &d->kernelCh);
}

static ncclResult_t tpStartEventV4(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* d) {
  if (eHandle == NULL || d == NULL) return ncclSuccess;
  return tpStartEvent(context, eHandle, d->type, d->parentObj, &d->coll, &d->kernelCh);
}

static ncclResult_t tpStopEvent(void* eHandle) {
  unsigned kind = 0;
  tpContext* ctx = NULL;
  tpSample* s = eHandle == NULL ? NULL : tpSampleOf(eHandle, &kind, &ctx);
  if (s != NULL) tpRelease(ctx, s, (uint32_t)((uint64_t)(uintptr_t)eHandle >> 16));
  return ncclSuccess;
}

static ncclResult_t tpRecordEventState(void* eHandle, ncclProfilerEventState_t eState,
                                       ncclProfilerEventStateArgs_t* eStateArgs) {
  if (eHandle == NULL || eState != ncclProfilerKernelChStop || eStateArgs == NULL) return ncclSuccess;
  unsigned kind = 0;
  tpContext* ctx = NULL;
  tpSample* s = tpSampleOf(eHandle, &kind, &ctx);
  if (s != NULL && kind == TP_KIND_KERNEL) tpMax(&s->stopNs, eStateArgs->kernelCh.pTimer);
  return ncclSuccess;
}

/* The sampling period K, or 0 when timing is off or the value is not a positive integer. */
static uint64_t tpSamplePeriod(ncclDebugLogger_t log) {
  const char* text = getenv(TP_SAMPLE_ENV);
  if (text == NULL || *text == '\0') return 0;
  char* end = NULL;
  errno = 0;
  unsigned long long k = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || *text < '0' || *text > '9' || k == 0 || k > (1ULL << 32)) {
    tpLog(log, NCCL_LOG_WARN, __LINE__, "%s=%.32s is not a whole number from 1 to 2^32; not timing", TP_SAMPLE_ENV,
          text);
    return 0;
  }
  return (uint64_t)k;
}

static ncclResult_t tpInit(void** context, uint64_t commId, int* eActivationMask, int nNodes, int nRanks, int rank,
                           ncclDebugLogger_t log) {
  if (context == NULL) return ncclSuccess;
  *context = NULL;
  const char* dir = getenv(TP_DIR_ENV);
  uint64_t sample = tpSamplePeriod(log);
  if (dir == NULL || *dir == '\0' || sample == 0) return ncclSuccess;
  tpContext* ctx = (tpContext*)calloc(1, sizeof(tpContext));
  if (ctx == NULL) {
    tpLog(log, NCCL_LOG_WARN, __LINE__, "out of memory; not timing this communicator");
    return ncclSuccess;
  }
  ctx->dir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (ctx->dir < 0) {
    tpLog(log, NCCL_LOG_WARN, __LINE__, "cannot open %s=%s (%s); not timing", TP_DIR_ENV, dir, strerror(errno));
    free(ctx);
    return ncclSuccess;
  }
  ctx->index = -1;
  for (int i = 0; i < TP_CONTEXTS && ctx->index < 0; i++) {
    tpContext* expected = NULL;
    if (__atomic_compare_exchange_n(&tpContexts[i], &expected, ctx, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) ctx->index = i;
  }
  if (ctx->index < 0) {
    tpLog(log, NCCL_LOG_WARN, __LINE__, "more than %d communicators at once; not timing this one", TP_CONTEXTS);
    close(ctx->dir);
    free(ctx);
    return ncclSuccess;
  }
  ctx->commId = commId;
  ctx->rank = rank;
  ctx->nRanks = nRanks;
  ctx->nNodes = nNodes;
  ctx->sample = sample;
  ctx->log = log;
  for (int f = 0; f < TP_FUNCS; f++)
    for (int c = 0; c < TP_CLASSES; c++)
      for (int w = 0; w < TP_WAYS; w++) ctx->ways[f][c][w].cell.minNs = UINT64_MAX;
  if (eActivationMask != NULL) {
    tpMask = eActivationMask;
    __atomic_fetch_or(eActivationMask, ncclProfileColl, __ATOMIC_RELAXED);
  }
  tpSetArmed(ctx, 1); /* call 0 is sampled */
  tpLog(log, NCCL_LOG_INFO, __LINE__, "timing 1 in %llu collectives of commId 0x%llx rank %d",
        (unsigned long long)sample, (unsigned long long)commId, rank);
  *context = ctx;
  return ncclSuccess;
}

static ncclResult_t tpInitV5(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                             int nRanks, int rank, ncclDebugLogger_t log) {
  (void)commName;
  return tpInit(context, commId, eActivationMask, nNodes, nRanks, rank, log);
}

static ncclResult_t tpInitV4(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                             int nNodes, int nRanks, int rank, ncclDebugLogger_t log) {
  (void)commName;
  return tpInit(context, commHash, eActivationMask, nNodes, nRanks, rank, log);
}

static void tpArm(char* out, size_t size) {
  const char* arm = getenv(TP_ARM_ENV);
  size_t n = arm == NULL ? 0 : strspn(arm, "0123456789");
  if (arm == NULL || n == 0 || arm[n] != '\0' || n >= size) {
    snprintf(out, size, "-");
  } else {
    snprintf(out, size, "%s", arm);
  }
}

static void tpWrite(tpContext* ctx) {
  static int sequence = 0;
  char host[HOST_NAME_MAX + 1];
  char name[TT_RECORD_NAME_MAX];
  FILE* out = ttCreateRecordFile(ctx->dir, "topo-tune-timing", &sequence, host, name);
  if (out == NULL) {
    tpLog(ctx->log, NCCL_LOG_WARN, __LINE__, "cannot create the timing record %s (%s)", name, strerror(errno));
    return;
  }
  char arm[32];
  tpArm(arm, sizeof(arm));
  fputs(TP_MAGIC, out);
  fprintf(out, "process %s:%ld comm %llx rank %d nranks %d nnodes %d sample %llu arm %s\n", host, (long)getpid(),
          (unsigned long long)ctx->commId, ctx->rank, ctx->nRanks, ctx->nNodes, (unsigned long long)ctx->sample, arm);
  fprintf(out, "unfinished %llu overflow %llu\n", (unsigned long long)ctx->unfinished,
          (unsigned long long)ctx->overflow);
  for (int f = 0; f < TP_FUNCS; f++) {
    for (int c = 0; c < TP_CLASSES; c++) {
      for (int w = 0; w < TP_WAYS; w++) {
        const tpWay* way = &ctx->ways[f][c][w];
        if (way->key == 0) continue;
        const tpCell* k = &way->cell;
        fprintf(out, "%s %llu %s/%s %llu %llu %llu %llu %llu %.9g %.9g\n", kFuncNames[f], 1ULL << c,
                kAlgoNames[(way->key - 1) / TP_PROTOS], kProtoNames[(way->key - 1) % TP_PROTOS],
                (unsigned long long)k->calls, (unsigned long long)k->timed, (unsigned long long)k->sumNs,
                (unsigned long long)(k->timed ? k->minNs : 0), (unsigned long long)k->maxNs, k->sumLog, k->sumSqLog);
      }
    }
  }
  if (fclose(out) != 0) {
    tpLog(ctx->log, NCCL_LOG_WARN, __LINE__, "cannot write the timing record %s (%s)", name, strerror(errno));
  }
}

static ncclResult_t tpFinalize(void* context) {
  tpContext* ctx = (tpContext*)context;
  if (ctx == NULL) return ncclSuccess;
  tpSetArmed(ctx, 0);
  for (int i = 0; i < TP_SLOTS; i++) {
    if (__atomic_load_n(&ctx->samples[i].pending, __ATOMIC_ACQUIRE) > 0) ctx->unfinished++;
  }
  tpWrite(ctx);
  /* Events that arrive after finalize find no context (NCCL sends none; a test could). */
  __atomic_store_n(&tpContexts[ctx->index], NULL, __ATOMIC_RELEASE);
  close(ctx->dir);
  free(ctx);
  return ncclSuccess;
}

/* NCCL looks these up by name, newest first (v6 from 2.30, v5 from 2.28, v4 from 2.25). */
TP_EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {
    .name = TP_PLUGIN_NAME,
    .init = tpInitV5,
    .startEvent = tpStartEventV5,
    .stopEvent = tpStopEvent,
    .recordEventState = tpRecordEventState,
    .finalize = tpFinalize,
};

/* v6 is v5's function table (nccl_profiler_abi.h): the same object under NCCL's newer name. */
TP_EXPORT extern const ncclProfiler_v6_t ncclProfiler_v6 __attribute__((alias("ncclProfiler_v5")));

TP_EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {
    .name = TP_PLUGIN_NAME,
    .init = tpInitV4,
    .startEvent = tpStartEventV4,
    .stopEvent = tpStopEvent,
    .recordEventState = tpRecordEventState,
    .finalize = tpFinalize,
};
