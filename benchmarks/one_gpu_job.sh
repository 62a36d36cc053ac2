#!/usr/bin/env bash
# benchmarks/multi_gpu_job.sh (the plugin's counters on a DDP job, its cost in nccl-tests, init -> rollout ->
# exec --compare) with RANKS_PER_GPU real NCCL ranks sharing the one GPU of a machine
# (benchmarks/results/h200-one-gpu-ranks.md): builds NCCL >= 2.30 from a source tree (ONLY_FUNCS, sm_90 only),
# puts it where torch loads libnccl.so.2 (the nvidia-nccl wheel's directory: the agent's workers and torchrun's
# ranks load it there; root), starts the CUDA MPS control daemon at its default pipe directory (the agent's
# workers get a fresh environment, so they find only that one), runs multi_gpu_job.sh with RANKS_PER_GPU and
# NCCL_HOME set, and stops MPS. Every step's output goes to OUT/<step>.log, the job's to OUT/job/.
# Usage (repository root, topo-tune importable by python3, nvcc, root):
#   NCCL_SRC=path/to/nccl-source NCCL_TESTS=path/to/nccl-tests RANKS_PER_GPU=2 PAIRS=5 BUDGET=6 \
#       benchmarks/one_gpu_job.sh OUT
set -u
OUT=${1:?usage: one_gpu_job.sh OUT}
NCCL_SRC=${NCCL_SRC:?NCCL_SRC must name an NCCL >= 2.30 source tree}
export RANKS_PER_GPU=${RANKS_PER_GPU:-2}
ONLY_FUNCS=${ONLY_FUNCS:-AllReduce Sum f32 * *|AllGather * *|Broadcast * *|SendRecv}
mkdir -p "$OUT" "${NCCL_BUILD:=$OUT/nccl-build}"
OUT=$(cd "$OUT" && pwd)
NCCL_BUILD=$(cd "$NCCL_BUILD" && pwd)
REPO=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY  # MPS's default directories, the ones every client finds

source "$REPO/benchmarks/gpu_steps.sh"

install_nccl() {  # over the wheel's libnccl.so.2, which torch loads; then what torch reports
    local wheel
    wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])') || return 1
    cp -L "$NCCL_BUILD/lib/libnccl.so.2" "$wheel/lib/libnccl.so.2" || return 1
    python3 -c 'import torch; from topo_tune.nccl.library import loaded_version
print("torch built against NCCL", ".".join(map(str, torch.cuda.nccl.version())), "loads", loaded_version())'
}

step versions gpu_versions
step build-nccl build_nccl || exit 1
step install-nccl install_nccl || exit 1
mps_start
NCCL_HOME=$NCCL_BUILD "$REPO/benchmarks/multi_gpu_job.sh" "$OUT/job"
rc=$?
mps_stop
exit $rc
