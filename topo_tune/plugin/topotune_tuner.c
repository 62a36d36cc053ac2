/*
 * topo-tune's NCCL tuner plugin (libnccl-tuner-topotune.so).
 *
 * Purpose: apply topo-tune's per-collective, per-message-size choices (algorithm, protocol, channel count)
 * inside NCCL, which environment variables cannot do: they set one value for every size. NCCL loads the
 * library with NCCL_TUNER_PLUGIN=topotune (or the library's path) and asks it, for every collective, to
 * edit the cost table NCCL computed.
 *
 * The table is a CSV file in the columns of NVIDIA's example tuner plugin
 *   collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
 * named by NCCL_TUNER_CONFIG_FILE. It is read once, when NCCL creates a communicator; only the rows whose
 * nNodes/nRanks fit that communicator are kept, and the file is never read again for it. Every rank of a
 * communicator must make the same choice for the same call (a rank that disagrees hangs the job), and a
 * table re-read mid-job would change under some ranks before others.
 *
 * Safety rules, each of which a test pins:
 *  - A cost entry NCCL set to -1 (NCCL_ALGO_PROTO_IGNORE) is never written: NCCL does not re-check the
 *    plugin's edits, and -1 marks combinations that are unsupported or unsafe here (LL128 where NCCL turned
 *    it off, NVLS without NVLink SHARP, ...). A row naming such an entry is passed over.
 *  - The chosen entry is lowered to 0.0, so NCCL's own selection (the smallest entry >= 0) picks it; no other
 *    entry is touched.
 *  - The channel count is set only when the row names one (channels != -1).
 *  - A row with algorithm and protocol both -1 ("keep NCCL's") edits no cost entry: it only sets the channel
 *    count of whatever NCCL picks. That is how a per-size channel choice is expressed when NCCL's own
 *    algorithm/protocol choice is unknown (the nccl benchmark does not report it). One of the two -1 alone
 *    is malformed.
 *  - With no matching row, a malformed table, an unreadable file or any other problem, the cost table and
 *    channel count stay as NCCL made them and every entry point returns ncclSuccess: NCCL fails the whole
 *    communicator (init) or the collective (getCollInfo) when a plugin returns an error.
 *
 * The record: with TOPOTUNE_TUNER_RECORD naming a file, the plugin appends one CSV line per distinct call
 * (collective, bytes, numPipeOps, regBuff) of each communicator, once, saying which (algorithm, protocol)
 * entries NCCL offered (cost >= 0), which one NCCL would have picked (the first smallest, as topoGetAlgoInfo
 * picks), which one the table left smallest (what runs), and the channel count the table set (-1: NCCL's):
 *   collective,bytes,numPipeOps,regBuff,nNodes,nRanks,nccl,applied,channels,offered
 *   allreduce,1048576,1,0,2,16,tree/ll128,ring/simple,-1,tree/ll tree/simple ring/ll ring/ll128 ring/simple
 * The benchmark worker reads it to report, per size, what NCCL offered and chose; the tuner composes per-size
 * rows only from offered entries. Recording never changes a choice, and a record that cannot be written is
 * given up with one WARN. A context's record needs no lock: NCCL asks about a communicator's collectives from
 * the thread that enqueues them, and a communicator may not be used by two threads at once.
 *
 * The workload count: with TOPO_TUNE_WORKLOAD_DIR naming a directory, each communicator counts its calls per
 * (collective, size class) in a fixed array allocated at init: class c holds the sizes in (2^(c-1), 2^c], so
 * no class straddles a tuner bucket. getCollInfo only adds to two counters (relaxed atomics: no lock, no
 * allocation, no branch beyond "counting?"); finalize writes them to a file of its own name inside that
 * directory (topo-tune-workload.<host>.<pid>.<n>.txt, created there with O_EXCL and O_NOFOLLOW, never a path
 * the job names) for `topo-tune workload import`:
 *   topo-tune workload record 1
 *   process <host>:<pid> nranks <n> nnodes <n>
 *   <collective> <class max bytes> <calls> <bytes>
 * NCCL calls getCollInfo once per group of aggregated tasks (same function, op and type within 4x in size,
 * summed; src/enqueue.cc) and never on CUDA graph replay, so the counts are lower bounds of the job's calls;
 * the data type is not passed to the tuner, so it is not counted.
 *
 * Non-goals: reloading the table, per-commId tables, changing NCCL's model constants (v5 init), chunk sizes
 * (v6 getChunkSize), and send/recv (NCCL does not consult tuners for point-to-point).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nccl_tuner_abi.h"
#include "topotune_record_file.h"

#define TT_EXPORT __attribute__((visibility("default")))
#define TT_PLUGIN_NAME "TopoTune"
#define TT_TABLE_ENV "NCCL_TUNER_CONFIG_FILE"
#define TT_FIELDS_MIN 8
#define TT_FIELDS_MAX 10
#define TT_MESSAGE_MAX 1024
#define TT_ERROR_MAX 256
#define TT_RECORD_ENV "TOPOTUNE_TUNER_RECORD"
/* Distinct calls recorded per communicator (a benchmark sweep makes a few dozen); past it recording stops. */
#define TT_RECORD_MAX 4096
#define TT_RECORD_HEADER "collective,bytes,numPipeOps,regBuff,nNodes,nRanks,nccl,applied,channels,offered\n"
#define TT_WORKLOAD_ENV "TOPO_TUNE_WORKLOAD_DIR"
#define TT_WORKLOAD_MAGIC "topo-tune workload record 1\n"
/* ncclFunc_t values counted (Broadcast .. AllReduce and NCCL's later functions); others go to the last slot. */
#define TT_WORKLOAD_FUNCS 8
#define TT_SIZE_CLASSES 64

/* One table row, already validated. -1 in a key field means "any". */
typedef struct {
  int collType;
  uint64_t minBytes;
  uint64_t maxBytes;
  int algorithm; /* -1 together with protocol -1: keep NCCL's choice, set only the channel count */
  int protocol;
  int nChannels; /* -1: keep NCCL's channel count */
  int nNodes;
  int nRanks;
  int numPipeOps;
  int regBuff;
  int lineNo;
  /* Set once the first call applied (or could not apply) this row, so the log says so once, not per call. */
  int announcedApplied;
  int announcedPassedOver;
} ttRow;

/* Calls of one (collective, size class) and their bytes. */
typedef struct {
  uint64_t calls;
  uint64_t bytes;
} ttCount;

/* One call already recorded. */
typedef struct {
  int collType;
  int numPipeOps;
  int regBuff;
  size_t nBytes;
} ttRecordKey;

typedef struct {
  ttRow* rows; /* the rows bound to this communicator, in file order */
  int nRows;
  size_t nRanks;
  size_t nNodes;
  ncclDebugLogger_t log;
  FILE* record; /* NULL: no record (not asked for, or given up) */
  ttRecordKey* recorded;
  int nRecorded;
  ttCount (*counts)[TT_SIZE_CLASSES]; /* NULL: not counting; else [TT_WORKLOAD_FUNCS][TT_SIZE_CLASSES] */
  int workloadDir;                    /* the directory's fd, opened at init (-1: none) */
} ttContext;

typedef struct {
  const char* name;
  int value;
} ttName;

static const ttName kCollectives[] = {
    {"broadcast", ncclFuncBroadcast},       {"reduce", ncclFuncReduce},       {"allgather", ncclFuncAllGather},
    {"reducescatter", ncclFuncReduceScatter}, {"allreduce", ncclFuncAllReduce}, {NULL, 0}};

static const ttName kAlgorithms[] = {{"tree", NCCL_ALGO_TREE},
                                     {"ring", NCCL_ALGO_RING},
                                     {"collnet_direct", NCCL_ALGO_COLLNET_DIRECT},
                                     {"collnet_chain", NCCL_ALGO_COLLNET_CHAIN},
                                     {"nvls", NCCL_ALGO_NVLS},
                                     {"nvls_tree", NCCL_ALGO_NVLS_TREE},
                                     {"pat", NCCL_ALGO_PAT},
                                     {NULL, 0}};

static const ttName kProtocols[] = {
    {"ll", NCCL_PROTO_LL}, {"ll128", NCCL_PROTO_LL128}, {"simple", NCCL_PROTO_SIMPLE}, {NULL, 0}};

static const char* nameOf(const ttName* names, int value) {
  if (value == -1) return "(NCCL's)";
  for (const ttName* n = names; n->name != NULL; n++) {
    if (n->value == value) return n->name;
  }
  return "unknown";
}

/*
 * Formats the message here and hands NCCL's logger a plain "%s": the logger is variadic, and formatting on
 * our side keeps the message whole for any logger (NCCL's, or a test's that cannot read C varargs).
 */
static void ttLog(ncclDebugLogger_t log, ncclDebugLogLevel level, unsigned long flags, int line, const char* fmt,
                  ...) __attribute__((format(printf, 5, 6)));
static void ttLog(ncclDebugLogger_t log, ncclDebugLogLevel level, unsigned long flags, int line, const char* fmt,
                  ...) {
  if (log == NULL) return;
  char message[TT_MESSAGE_MAX];
  int offset = snprintf(message, sizeof(message), "TUNER/" TT_PLUGIN_NAME ": ");
  va_list args;
  va_start(args, fmt);
  vsnprintf(message + offset, sizeof(message) - (size_t)offset, fmt, args);
  va_end(args);
  /* The bare file name: __FILE__ would be the temporary directory the library was built in. */
  log(level, flags, "topotune_tuner.c", line, "%s", message);
}

static char* trim(char* text) {
  while (*text == ' ' || *text == '\t') text++;
  char* end = text + strlen(text);
  while (end > text && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r' || end[-1] == '\n')) end--;
  *end = '\0';
  return text;
}

static int lookupName(const ttName* names, const char* text, int* value) {
  for (const ttName* n = names; n->name != NULL; n++) {
    if (strcasecmp(n->name, text) == 0) {
      *value = n->value;
      return 0;
    }
  }
  return -1;
}

/* A byte count: decimal digits only, no sign, fits in 64 bits. */
static int parseBytes(const char* text, uint64_t* value) {
  if (*text < '0' || *text > '9') return -1;
  char* end = NULL;
  errno = 0;
  unsigned long long parsed = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') return -1;
  *value = (uint64_t)parsed;
  return 0;
}

/* An int that is either -1 ("any") or within [low, high]. */
static int parseKey(const char* text, long low, long high, int* value) {
  if (*text == '\0') return -1;
  char* end = NULL;
  errno = 0;
  long parsed = strtol(text, &end, 10);
  if (errno != 0 || *end != '\0') return -1;
  if (parsed != -1 && (parsed < low || parsed > high)) return -1;
  *value = (int)parsed;
  return 0;
}

/*
 * Parses one data line into row. Returns 0, or -1 with a message naming the field in error.
 * The line is modified in place.
 */
static int parseRow(char* line, ttRow* row, char* error, size_t errorSize) {
  char* fields[TT_FIELDS_MAX];
  int nFields = 0;
  char* cursor = line;
  for (;;) {
    char* comma = strchr(cursor, ',');
    if (nFields == TT_FIELDS_MAX) {
      int extra = 1;
      for (char* c = cursor; (c = strchr(c, ',')) != NULL; c++) extra++;
      snprintf(error, errorSize, "expected %d to %d comma-separated fields, got %d", TT_FIELDS_MIN, TT_FIELDS_MAX,
               nFields + extra);
      return -1;
    }
    if (comma != NULL) *comma = '\0';
    fields[nFields++] = trim(cursor);
    if (comma == NULL) break;
    cursor = comma + 1;
  }
  if (nFields < TT_FIELDS_MIN) {
    snprintf(error, errorSize, "expected %d to %d comma-separated fields, got %d", TT_FIELDS_MIN, TT_FIELDS_MAX,
             nFields);
    return -1;
  }
  if (lookupName(kCollectives, fields[0], &row->collType) != 0) {
    snprintf(error, errorSize,
             "collective_type '%.64s' is not one of broadcast, reduce, allgather, reducescatter, allreduce",
             fields[0]);
    return -1;
  }
  if (parseBytes(fields[1], &row->minBytes) != 0) {
    snprintf(error, errorSize, "min_bytes '%.64s' is not a non-negative integer", fields[1]);
    return -1;
  }
  if (parseBytes(fields[2], &row->maxBytes) != 0) {
    snprintf(error, errorSize, "max_bytes '%.64s' is not a non-negative integer", fields[2]);
    return -1;
  }
  if (row->maxBytes < row->minBytes) {
    snprintf(error, errorSize, "max_bytes %llu is below min_bytes %llu", (unsigned long long)row->maxBytes,
             (unsigned long long)row->minBytes);
    return -1;
  }
  if (strcmp(fields[3], "-1") == 0 || strcmp(fields[4], "-1") == 0) {
    if (strcmp(fields[3], "-1") != 0 || strcmp(fields[4], "-1") != 0) {
      snprintf(error, errorSize, "algorithm '%.64s' and protocol '%.64s': -1 (keep NCCL's) must be given for both",
               fields[3], fields[4]);
      return -1;
    }
    row->algorithm = -1;
    row->protocol = -1;
  } else if (lookupName(kAlgorithms, fields[3], &row->algorithm) != 0) {
    snprintf(error, errorSize,
             "algorithm '%.64s' is not one of tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat",
             fields[3]);
    return -1;
  }
  if (row->algorithm != -1 && lookupName(kProtocols, fields[4], &row->protocol) != 0) {
    snprintf(error, errorSize, "protocol '%.64s' is not one of ll, ll128, simple", fields[4]);
    return -1;
  }
  /* NCCL caps a plugin's channel count at the communicator's own (enqueue.cc), so only the sign is checked. */
  if (parseKey(fields[5], 1, INT32_MAX, &row->nChannels) != 0) {
    snprintf(error, errorSize, "channels '%.64s' is neither -1 nor a positive integer", fields[5]);
    return -1;
  }
  if (parseKey(fields[6], 1, INT32_MAX, &row->nNodes) != 0) {
    snprintf(error, errorSize, "nNodes '%.64s' is neither -1 nor a positive integer", fields[6]);
    return -1;
  }
  if (parseKey(fields[7], 1, INT32_MAX, &row->nRanks) != 0) {
    snprintf(error, errorSize, "nRanks '%.64s' is neither -1 nor a positive integer", fields[7]);
    return -1;
  }
  row->numPipeOps = -1;
  if (nFields > 8 && parseKey(fields[8], 1, INT32_MAX, &row->numPipeOps) != 0) {
    snprintf(error, errorSize, "numPipeOps '%.64s' is neither -1 nor a positive integer", fields[8]);
    return -1;
  }
  row->regBuff = -1;
  if (nFields > 9 && parseKey(fields[9], 0, 1, &row->regBuff) != 0) {
    snprintf(error, errorSize, "regBuff '%.64s' is not -1, 0 or 1", fields[9]);
    return -1;
  }
  row->announcedApplied = 0;
  row->announcedPassedOver = 0;
  return 0;
}

static int rowFitsCommunicator(const ttRow* row, size_t nNodes, size_t nRanks) {
  return (row->nNodes == -1 || (size_t)row->nNodes == nNodes) && (row->nRanks == -1 || (size_t)row->nRanks == nRanks);
}

/* FNV-1a over the file's bytes: logged so that ranks bound to different table contents can be spotted. */
static uint64_t fnv1a(uint64_t hash, const char* bytes, size_t length) {
  for (size_t i = 0; i < length; i++) {
    hash ^= (unsigned char)bytes[i];
    hash *= 1099511628211ULL;
  }
  return hash;
}

/*
 * Reads the table at path and keeps the rows for this communicator. On any read failure the context keeps no
 * rows at all: half a table could make this rank choose differently from a rank that read all of it.
 */
static void bindTable(ttContext* ctx, const char* path) {
  FILE* file = fopen(path, "r");
  if (file == NULL) {
    ttLog(ctx->log, NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __LINE__,
          "cannot read tuner table %s (%s); NCCL's default tuning applies", path, strerror(errno));
    return;
  }
  char* line = NULL;
  size_t capacity = 0;
  ssize_t length;
  int lineNo = 0;
  int nData = 0;
  int nMalformed = 0;
  int nOtherCommunicators = 0;
  int allocated = 0;
  int failed = 0;
  uint64_t hash = 14695981039346656037ULL;
  char error[TT_ERROR_MAX];
  while ((length = getline(&line, &capacity, file)) != -1) {
    lineNo++;
    hash = fnv1a(hash, line, (size_t)length);
    char* text = trim(line);
    if (*text == '\0' || *text == '#') continue;
    if (strncasecmp(text, "collective_type,", strlen("collective_type,")) == 0) continue; /* a header row */
    nData++;
    ttRow row;
    if (parseRow(text, &row, error, sizeof(error)) != 0) {
      nMalformed++;
      ttLog(ctx->log, NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __LINE__, "%s:%d: %s; line skipped", path, lineNo,
            error);
      continue;
    }
    row.lineNo = lineNo;
    if (!rowFitsCommunicator(&row, ctx->nNodes, ctx->nRanks)) {
      nOtherCommunicators++;
      continue;
    }
    if (ctx->nRows == allocated) {
      int grown = allocated == 0 ? 16 : allocated * 2;
      ttRow* rows = (ttRow*)realloc(ctx->rows, (size_t)grown * sizeof(ttRow));
      if (rows == NULL) {
        failed = ENOMEM;
        break;
      }
      ctx->rows = rows;
      allocated = grown;
    }
    ctx->rows[ctx->nRows++] = row;
  }
  if (!failed && ferror(file)) failed = errno != 0 ? errno : EIO;
  free(line);
  fclose(file);
  if (failed) {
    free(ctx->rows);
    ctx->rows = NULL;
    ctx->nRows = 0;
    ttLog(ctx->log, NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __LINE__,
          "cannot read tuner table %s (%s); NCCL's default tuning applies", path, strerror(failed));
    return;
  }
  ttLog(ctx->log, NCCL_LOG_INFO, NCCL_INIT | NCCL_TUNING, __LINE__,
        "bound %d of %d rows from %s (fnv1a64 %016llx) for nNodes=%zu nRanks=%zu; skipped %d rows for other "
        "communicators and %d malformed lines",
        ctx->nRows, nData, path, (unsigned long long)hash, ctx->nNodes, ctx->nRanks, nOtherCommunicators,
        nMalformed);
  for (int i = 0; i < ctx->nRows; i++) {
    const ttRow* r = &ctx->rows[i];
    ttLog(ctx->log, NCCL_LOG_INFO, NCCL_TUNING, __LINE__,
          "row at line %d: %s [%llu-%llu] -> %s/%s channels=%d numPipeOps=%d regBuff=%d", r->lineNo,
          nameOf(kCollectives, r->collType), (unsigned long long)r->minBytes, (unsigned long long)r->maxBytes,
          nameOf(kAlgorithms, r->algorithm), nameOf(kProtocols, r->protocol), r->nChannels, r->numPipeOps,
          r->regBuff);
  }
}

/* The entry NCCL's topoGetAlgoInfo picks: the first smallest cost >= 0 (algorithm-major); -1 when none. */
static int cheapest(const float* table, int numAlgo, int numProto) {
  int best = -1;
  for (int i = 0; i < numAlgo * numProto; i++) {
    if (table[i] >= 0.0f && (best == -1 || table[i] < table[best])) best = i;
  }
  return best;
}

static void entryName(char* out, size_t size, int entry, int numProto) {
  if (entry < 0) {
    snprintf(out, size, "none");
  } else {
    snprintf(out, size, "%s/%s", nameOf(kAlgorithms, entry / numProto), nameOf(kProtocols, entry % numProto));
  }
}

static void openRecord(ttContext* ctx) {
  const char* path = getenv(TT_RECORD_ENV);
  if (path == NULL || *path == '\0') return;
  ctx->record = fopen(path, "a");
  if (ctx->record == NULL) {
    ttLog(ctx->log, NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __LINE__, "cannot open the record %s (%s); not recording",
          path, strerror(errno));
    return;
  }
  /* "a" positions at the end: an empty file gets the header first. */
  if (fseek(ctx->record, 0, SEEK_END) == 0 && ftell(ctx->record) == 0) {
    fputs(TT_RECORD_HEADER, ctx->record);
    fflush(ctx->record);
  }
}

static void stopRecording(ttContext* ctx, const char* why) {
  ttLog(ctx->log, NCCL_LOG_WARN, NCCL_TUNING, __LINE__, "record given up: %s", why);
  fclose(ctx->record);
  ctx->record = NULL;
}

/* Appends the call's line once per (collective, bytes, numPipeOps, regBuff). */
static void recordCall(ttContext* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, int regBuff,
                       const float* before, const float* after, int numAlgo, int numProto, int nChannels) {
  for (int i = 0; i < ctx->nRecorded; i++) {
    const ttRecordKey* k = &ctx->recorded[i];
    if (k->collType == (int)collType && k->nBytes == nBytes && k->numPipeOps == numPipeOps && k->regBuff == regBuff)
      return;
  }
  if (ctx->nRecorded == TT_RECORD_MAX) {
    stopRecording(ctx, "too many distinct calls on one communicator");
    return;
  }
  if (ctx->recorded == NULL) {
    ctx->recorded = (ttRecordKey*)calloc(TT_RECORD_MAX, sizeof(ttRecordKey));
    if (ctx->recorded == NULL) {
      stopRecording(ctx, "out of memory");
      return;
    }
  }
  ttRecordKey key = {(int)collType, numPipeOps, regBuff, nBytes};
  ctx->recorded[ctx->nRecorded++] = key;
  char nccl[48];
  char applied[48];
  entryName(nccl, sizeof(nccl), cheapest(before, numAlgo, numProto), numProto);
  entryName(applied, sizeof(applied), cheapest(after, numAlgo, numProto), numProto);
  char offered[TT_MESSAGE_MAX];
  size_t used = 0;
  offered[0] = '\0';
  for (int i = 0; i < numAlgo * numProto; i++) {
    if (!(before[i] >= 0.0f)) continue;
    char entry[48];
    entryName(entry, sizeof(entry), i, numProto);
    int n = snprintf(offered + used, sizeof(offered) - used, "%s%s", used ? " " : "", entry);
    if (n < 0 || (size_t)n >= sizeof(offered) - used) break;
    used += (size_t)n;
  }
  fprintf(ctx->record, "%s,%zu,%d,%d,%zu,%zu,%s,%s,%d,%s\n", nameOf(kCollectives, (int)collType), nBytes, numPipeOps,
          regBuff, ctx->nNodes, ctx->nRanks, nccl, applied, nChannels > 0 ? nChannels : -1, offered);
  if (fflush(ctx->record) != 0 || ferror(ctx->record)) stopRecording(ctx, strerror(errno));
}

/* Class c holds (2^(c-1), 2^c]; sizes 0 and 1 are class 0. */
static inline int sizeClass(size_t nBytes) {
  if (nBytes <= 1) return 0;
  int c = 64 - __builtin_clzll((unsigned long long)(nBytes - 1));
  return c < TT_SIZE_CLASSES ? c : TT_SIZE_CLASSES - 1;
}

static inline void countCall(ttContext* ctx, ncclFunc_t collType, size_t nBytes) {
  int f = (int)collType >= 0 && (int)collType < TT_WORKLOAD_FUNCS ? (int)collType : TT_WORKLOAD_FUNCS - 1;
  ttCount* c = &ctx->counts[f][sizeClass(nBytes)];
  __atomic_fetch_add(&c->calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->bytes, (uint64_t)nBytes, __ATOMIC_RELAXED);
}

static void openWorkload(ttContext* ctx) {
  ctx->workloadDir = -1;
  const char* dir = getenv(TT_WORKLOAD_ENV);
  if (dir == NULL || *dir == '\0') return;
  ctx->workloadDir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (ctx->workloadDir < 0) {
    ttLog(ctx->log, NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __LINE__, "cannot open %s=%s (%s); not counting calls",
          TT_WORKLOAD_ENV, dir, strerror(errno));
    return;
  }
  ctx->counts = (ttCount(*)[TT_SIZE_CLASSES])calloc(TT_WORKLOAD_FUNCS, sizeof(*ctx->counts));
  if (ctx->counts == NULL) {
    ttLog(ctx->log, NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __LINE__, "out of memory; not counting calls");
    close(ctx->workloadDir);
    ctx->workloadDir = -1;
  }
}

static const char* funcName(int f, char* buffer, size_t size) {
  for (const ttName* n = kCollectives; n->name != NULL; n++) {
    if (n->value == f) return n->name;
  }
  if (f == TT_WORKLOAD_FUNCS - 1) return "other_function"; /* every function from this one on */
  snprintf(buffer, size, "function%d", f);
  return buffer;
}

/* Writes the counts to a new file of the plugin's own name in the directory; one WARN if it cannot. */
static void writeWorkload(ttContext* ctx) {
  static int sequence = 0;
  char host[HOST_NAME_MAX + 1];
  char name[TT_RECORD_NAME_MAX];
  FILE* out = ttCreateRecordFile(ctx->workloadDir, "topo-tune-workload", &sequence, host, name);
  if (out == NULL) {
    ttLog(ctx->log, NCCL_LOG_WARN, NCCL_TUNING, __LINE__, "cannot create the workload count %s (%s)", name,
          strerror(errno));
    return;
  }
  fputs(TT_WORKLOAD_MAGIC, out);
  fprintf(out, "process %s:%ld nranks %zu nnodes %zu\n", host, (long)getpid(), ctx->nRanks, ctx->nNodes);
  for (int f = 0; f < TT_WORKLOAD_FUNCS; f++) {
    char buffer[32];
    for (int c = 0; c < TT_SIZE_CLASSES; c++) {
      uint64_t calls = __atomic_load_n(&ctx->counts[f][c].calls, __ATOMIC_RELAXED);
      if (calls == 0) continue;
      fprintf(out, "%s %llu %llu %llu\n", funcName(f, buffer, sizeof(buffer)), 1ULL << c, (unsigned long long)calls,
              (unsigned long long)__atomic_load_n(&ctx->counts[f][c].bytes, __ATOMIC_RELAXED));
    }
  }
  if (fclose(out) != 0) {
    ttLog(ctx->log, NCCL_LOG_WARN, NCCL_TUNING, __LINE__, "cannot write the workload count %s (%s)", name,
          strerror(errno));
  }
}

static ncclResult_t ttInit(void** context, uint64_t commId, int hasCommId, size_t nRanks, size_t nNodes,
                           ncclDebugLogger_t log) {
  if (context == NULL) return ncclSuccess;
  *context = NULL;
  ttContext* ctx = (ttContext*)calloc(1, sizeof(ttContext));
  if (ctx == NULL) {
    /* getCollInfo treats a NULL context as "no table"; failing init would fail the communicator. */
    ttLog(log, NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __LINE__, "out of memory; NCCL's default tuning applies");
    return ncclSuccess;
  }
  ctx->nRanks = nRanks;
  ctx->nNodes = nNodes;
  ctx->log = log;
  if (hasCommId) {
    ttLog(log, NCCL_LOG_INFO, NCCL_INIT | NCCL_TUNING, __LINE__, "init for commId 0x%llx, nNodes=%zu nRanks=%zu",
          (unsigned long long)commId, nNodes, nRanks);
  } else {
    ttLog(log, NCCL_LOG_INFO, NCCL_INIT | NCCL_TUNING, __LINE__, "init for nNodes=%zu nRanks=%zu", nNodes, nRanks);
  }
  const char* path = getenv(TT_TABLE_ENV);
  if (path == NULL || *path == '\0') {
    ttLog(log, NCCL_LOG_INFO, NCCL_INIT | NCCL_TUNING, __LINE__,
          TT_TABLE_ENV " is not set; NCCL's default tuning applies");
  } else {
    bindTable(ctx, path);
  }
  openRecord(ctx);
  openWorkload(ctx);
  *context = ctx;
  return ncclSuccess;
}

/* Edits the cost table and channel count by the first row that matches the call and can apply. */
static void applyRows(ttContext* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, float* table, int numAlgo,
                      int numProto, int regBuff, int* nChannels) {
  for (int i = 0; i < ctx->nRows; i++) {
    ttRow* row = &ctx->rows[i];
    if (row->collType != (int)collType) continue;
    if ((uint64_t)nBytes < row->minBytes || (uint64_t)nBytes > row->maxBytes) continue;
    if (row->numPipeOps != -1 && row->numPipeOps != numPipeOps) continue;
    /* regBuff is -1 when NCCL did not say (the v3 interface); then only rows for any regBuff match. */
    if (row->regBuff != -1 && row->regBuff != regBuff) continue;
    if (row->algorithm == -1) {
      /* Keep NCCL's algorithm/protocol: no cost entry is touched, only the channel count. */
      if (row->nChannels != -1) *nChannels = row->nChannels;
      if (__atomic_exchange_n(&row->announcedApplied, 1, __ATOMIC_RELAXED) == 0) {
        ttLog(ctx->log, NCCL_LOG_INFO, NCCL_TUNING, __LINE__,
              "row at line %d applied: %s of %zu bytes -> NCCL's algorithm/protocol, channels=%d "
              "(later matches logged at TRACE)",
              row->lineNo, nameOf(kCollectives, row->collType), nBytes, row->nChannels);
      } else {
        ttLog(ctx->log, NCCL_LOG_TRACE, NCCL_TUNING, __LINE__, "row at line %d applied: %s of %zu bytes", row->lineNo,
              nameOf(kCollectives, row->collType), nBytes);
      }
      return;
    }
    if (row->algorithm >= numAlgo || row->protocol >= numProto) {
      if (__atomic_exchange_n(&row->announcedPassedOver, 1, __ATOMIC_RELAXED) == 0) {
        ttLog(ctx->log, NCCL_LOG_INFO, NCCL_TUNING, __LINE__,
              "row at line %d names %s/%s, which this NCCL does not have (%d algorithms, %d protocols); passed over",
              row->lineNo, nameOf(kAlgorithms, row->algorithm), nameOf(kProtocols, row->protocol), numAlgo, numProto);
      }
      continue;
    }
    float* cost = &table[row->algorithm * numProto + row->protocol];
    /* NCCL's -1 (and anything else below zero, or NaN) marks a combination it ruled out: never revive it. */
    if (!(*cost >= 0.0f)) {
      if (__atomic_exchange_n(&row->announcedPassedOver, 1, __ATOMIC_RELAXED) == 0) {
        ttLog(ctx->log, NCCL_LOG_INFO, NCCL_TUNING, __LINE__,
              "row at line %d: NCCL ruled out %s/%s for %s of %zu bytes; row passed over", row->lineNo,
              nameOf(kAlgorithms, row->algorithm), nameOf(kProtocols, row->protocol),
              nameOf(kCollectives, row->collType), nBytes);
      }
      continue;
    }
    *cost = 0.0f;
    if (row->nChannels != -1) *nChannels = row->nChannels;
    if (__atomic_exchange_n(&row->announcedApplied, 1, __ATOMIC_RELAXED) == 0) {
      ttLog(ctx->log, NCCL_LOG_INFO, NCCL_TUNING, __LINE__,
            "row at line %d applied: %s of %zu bytes -> %s/%s channels=%d (later matches logged at TRACE)",
            row->lineNo, nameOf(kCollectives, row->collType), nBytes, nameOf(kAlgorithms, row->algorithm),
            nameOf(kProtocols, row->protocol), row->nChannels);
    } else {
      ttLog(ctx->log, NCCL_LOG_TRACE, NCCL_TUNING, __LINE__, "row at line %d applied: %s of %zu bytes", row->lineNo,
            nameOf(kCollectives, row->collType), nBytes);
    }
    return;
  }
}

static ncclResult_t ttGetCollInfo(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                  float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels) {
  ttContext* ctx = (ttContext*)context;
  if (ctx == NULL) return ncclSuccess;
  if (ctx->counts != NULL) countCall(ctx, collType, nBytes);
  if (collCostTable == NULL || nChannels == NULL || numAlgo <= 0 || numProto <= 0) return ncclSuccess;
  /* NCCL passes its float[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS] array cast to float**. */
  float* table = (float*)collCostTable;
  int cells = numAlgo * numProto;
  float before[64];
  int recording = ctx->record != NULL && cells <= 64;
  if (recording) memcpy(before, table, (size_t)cells * sizeof(float));
  applyRows(ctx, collType, nBytes, numPipeOps, table, numAlgo, numProto, regBuff, nChannels);
  if (recording) recordCall(ctx, collType, nBytes, numPipeOps, regBuff, before, table, numAlgo, numProto, *nChannels);
  return ncclSuccess;
}

static ncclResult_t ttFinalize(void* context) {
  ttContext* ctx = (ttContext*)context;
  if (ctx == NULL) return ncclSuccess;
  if (ctx->record != NULL) fclose(ctx->record);
  if (ctx->counts != NULL) writeWorkload(ctx);
  if (ctx->workloadDir >= 0) close(ctx->workloadDir);
  free(ctx->counts);
  free(ctx->recorded);
  free(ctx->rows);
  free(ctx);
  return ncclSuccess;
}

/* v3/v4: init has no commId; v3's getCollInfo has no regBuff. */
static ncclResult_t ttInitV3(size_t nRanks, size_t nNodes, ncclDebugLogger_t log, void** context) {
  return ttInit(context, 0, 0, nRanks, nNodes, log);
}

static ncclResult_t ttGetCollInfoV3(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                    float** collCostTable, int numAlgo, int numProto, int* nChannels) {
  return ttGetCollInfo(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, -1, nChannels);
}

/* v5/v6: NCCL's model constants are left as NCCL set them. */
static ncclResult_t ttInitV5(void** context, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                             ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants) {
  (void)nvlDomainInfo;
  (void)constants;
  return ttInit(context, commId, 1, nRanks, nNodes, log);
}

/* NCCL looks these up by name, newest first (v6 from 2.30, v5 from 2.28, v4 from 2.24, v3 from 2.22). */
TT_EXPORT const ncclTuner_v6_t ncclTunerPlugin_v6 = {
    .name = TT_PLUGIN_NAME,
    .init = ttInitV5,
    .getCollInfo = ttGetCollInfo,
    .finalize = ttFinalize,
    .getChunkSize = NULL,
};

TT_EXPORT const ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = TT_PLUGIN_NAME,
    .init = ttInitV5,
    .getCollInfo = ttGetCollInfo,
    .finalize = ttFinalize,
};

TT_EXPORT const ncclTuner_v4_t ncclTunerPlugin_v4 = {
    .name = TT_PLUGIN_NAME,
    .init = ttInitV3,
    .getCollInfo = ttGetCollInfo,
    .destroy = ttFinalize,
};

TT_EXPORT const ncclTuner_v3_t ncclTunerPlugin_v3 = {
    .name = TT_PLUGIN_NAME,
    .init = ttInitV3,
    .getCollInfo = ttGetCollInfoV3,
    .destroy = ttFinalize,
};
