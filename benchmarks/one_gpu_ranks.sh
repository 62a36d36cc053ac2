#!/usr/bin/env bash
# N real NCCL ranks sharing one GPU (benchmarks/results/h200-one-gpu-ranks.md): builds NCCL >= 2.30 from a
# source tree (ONLY_FUNCS, sm_90 only), builds topo-tune's tuner plugin with cc, then for each repeat, each N
# in RANKS and each scenario (baseline: no plugin; plugin: a per-size table and the plugin's per-rank record)
# starts the MPS control daemon, runs benchmarks/one_gpu_ranks.py launch, and stops the daemon (a later run
# in one MPS session has failed with "device busy or unavailable"). NVLink multicast stays off.
# Every step's output goes to OUT/<step>.log; `== step rc=... wall=...` goes to stdout.
# Usage (repository root, python3 with torch, nvcc and root for MPS):
#   NCCL_SRC=path/to/nccl-source NCCL_BUILD=path/to/build-dir RANKS="2 4" REPEATS=2 benchmarks/one_gpu_ranks.sh OUT
set -u
OUT=${1:?usage: one_gpu_ranks.sh OUT}
NCCL_SRC=${NCCL_SRC:?NCCL_SRC must name an NCCL >= 2.30 source tree}
RANKS=${RANKS:-2 4}
REPEATS=${REPEATS:-2}
NCCL_BUILD=${NCCL_BUILD:-$OUT/nccl-build}
ONLY_FUNCS=${ONLY_FUNCS:-AllReduce Sum f32 * *|AllGather * *|Broadcast * *|SendRecv}
mkdir -p "$OUT" "$NCCL_BUILD"
OUT=$(cd "$OUT" && pwd)
NCCL_BUILD=$(cd "$NCCL_BUILD" && pwd)
REPO=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_MPS_PIPE_DIRECTORY=$OUT/mps-pipe CUDA_MPS_LOG_DIRECTORY=$OUT/mps-log

source "$REPO/benchmarks/gpu_steps.sh"

mps_run() {  # mps_run NAME N SCENARIO: a fresh MPS daemon around one launch
    mps_start
    timeout 180 python3 "$REPO/benchmarks/one_gpu_ranks.py" launch --ranks "$2" --scenario "$3" --out "$OUT/runs/$1"
    local rc=$?
    mps_stop
    return $rc
}

step versions source_versions
step build-nccl build_nccl || exit 1
step build-plugin build_plugin || exit 1
export LD_PRELOAD=$NCCL_BUILD/lib/libnccl.so.2 PLUGIN=$OUT/plugin/libnccl-tuner-topotune.so
for repeat in $(seq 1 "$REPEATS"); do
    for n in $RANKS; do
        for scenario in baseline plugin; do
            step "run-$n-$scenario-$repeat" mps_run "n$n-$scenario-r$repeat" "$n" "$scenario"
        done
    done
done
python3 "$REPO/benchmarks/one_gpu_ranks.py" summarize "$OUT/runs" >"$OUT/summary.md" 2>&1
echo "== summary rc=$?"
