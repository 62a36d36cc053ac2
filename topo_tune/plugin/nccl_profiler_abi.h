/*
 * The slice of NCCL's profiler-plugin ABI that topo-tune's profiler (topotune_profiler.c) implements.
 *
 * The struct layouts below are copied from NVIDIA's NCCL, plugins/profiler/example/nccl/profiler.h,
 * profiler_v4.h and profiler_v5.h (NCCL 2.30.7), trimmed to the event kinds the profiler reads:
 *   SPDX-FileCopyrightText: Copyright (c) 2024-2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
 *   SPDX-License-Identifier: Apache-2.0
 * (https://www.apache.org/licenses/LICENSE-2.0). Only layouts and values matter: NCCL finds the exported
 * structs with dlsym() and calls through their function pointers, so every field order, enum value and
 * parameter list must stay exactly as NCCL declares it. The v6 interface (NCCL 2.30) has v5's function table
 * and a descriptor that begins with v5's; the fields read here sit at the same offsets in both.
 *
 * Not covered: v1-v3 (no kernel events before v4), the network-plugin, proxy and copy-engine descriptors.
 */
#ifndef TOPOTUNE_NCCL_PROFILER_ABI_H_
#define TOPOTUNE_NCCL_PROFILER_ABI_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl_tuner_abi.h" /* ncclResult_t, ncclDebugLogger_t and the log levels */

/* profiler.h: event types (bits of the activation mask) and the one state read here. */
enum {
  ncclProfileColl = (1 << 1),     /* a collective, as enqueued: function, count, type, algorithm, protocol */
  ncclProfileKernelCh = (1 << 6), /* one channel of a collective's kernel, with GPU timestamps */
};
typedef int ncclProfilerEventState_t;
#define ncclProfilerKernelChStop 22

/* The union members a collective and a kernel channel use; identical in v4 and v5. */
typedef struct {
  uint64_t seqNumber;
  const char* func;
  void const* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
} ncclProfilerCollDescr_t;

typedef struct {
  uint8_t channelId;
  uint64_t pTimer; /* start timestamp from the GPU's globaltimer (ns) */
} ncclProfilerKernelChDescr_t;

/* profiler_v5.h (v5 adds parentGroup to coll and the API events, none of which change these offsets). */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      ncclProfilerCollDescr_t fields;
      void* parentGroup;
    } coll;
    ncclProfilerKernelChDescr_t kernelCh;
    /* The largest member of NCCL's union (proxyOp, p2p ...) is smaller than coll; nothing else is read. */
  };
} ncclProfilerEventDescr_v5_t;

/* profiler_v4.h: type is one byte (padded to the pointer that follows). */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    ncclProfilerCollDescr_t coll;
    ncclProfilerKernelChDescr_t kernelCh;
  };
} ncclProfilerEventDescr_v4_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer; /* stop timestamp from the GPU's globaltimer (ns) */
  } kernelCh;
} ncclProfilerEventStateArgs_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

/* v6 (NCCL 2.30): v5's table; its descriptor extends v5's union with copy-engine events only. */
typedef ncclProfiler_v5_t ncclProfiler_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

#endif
