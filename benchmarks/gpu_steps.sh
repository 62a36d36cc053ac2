# Shell functions the GPU harnesses (multi_gpu_job.sh, one_gpu_ranks.sh, one_gpu_job.sh, one_gpu_learning.sh) share;
# sourced, never run.
# They write into $OUT and read $REPO, which the sourcing script sets.

step() {  # step NAME CMD...: run CMD, its output in OUT/NAME.log; print rc, wall time and the log's tail
    local name=$1 start rc
    shift
    echo "== $name: $*"
    start=$(date +%s.%N)
    "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "== $name rc=$rc wall=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")s"
    tail -n "${TAIL:-20}" "$OUT/$name.log"
    return $rc
}

gpu_versions() {  # the GPU, driver, Python, torch, CUDA and torch's own NCCL
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count())'
}

source_versions() {  # gpu_versions, nvcc and the NCCL source tree's version (NCCL_SRC)
    gpu_versions
    nvcc --version | tail -n 2
    grep -E '^NCCL_(MAJOR|MINOR|PATCH)' "$NCCL_SRC/makefiles/version.mk"
}

build_plugin() {  # into OUT/plugin with plain cc: the flags and units of topo_tune/plugin/build.py (-lm last)
    mkdir -p "$OUT/plugin"
    cc -std=c11 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -o "$OUT/plugin/libnccl-tuner-topotune.so" \
        "$REPO/topo_tune/plugin/topotune_tuner.c" "$REPO/topo_tune/plugin/topotune_profiler.c" -lm
}

build_nccl() {  # NCCL from the source tree NCCL_SRC into NCCL_BUILD: sm_90 and the ONLY_FUNCS collectives alone
    make -C "$NCCL_SRC" -j"$(nproc)" src.build BUILDDIR="$NCCL_BUILD" \
        NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" ONLY_FUNCS="$ONLY_FUNCS"
}

mps_start() {  # the CUDA MPS control daemon (as root), so ranks sharing a GPU run side by side, not time-sliced
    [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d
}

mps_stop() {  # the control daemon and server exit shortly after the quit; a fresh one must not meet them
    echo quit | nvidia-cuda-mps-control
    local waited=0
    while pgrep -x nvidia-cuda-mps >/dev/null && ((waited++ < 50)); do sleep 0.2; done
}

build_nccl_tests() {  # build_nccl_tests SRC DIR NCCL_HOME CUDA_HOME: all_reduce_perf into DIR/build/
    # With RANKS_PER_GPU > 1 the copy is patched first: nccl-tests puts a process's i-th rank on device i,
    # so the device index wraps onto the visible GPUs (`-g 2` is then two ranks on GPU 0).
    cp -r "$1" "$2" || return 1
    ln -sf libnccl.so.2 "$3/lib/libnccl.so" 2>/dev/null
    if [ "${RANKS_PER_GPU:-1}" -gt 1 ]; then
        sed -i 's|gpus\[i\] = (gpu0 != -1 ? gpu0 : localRank\*nThreads\*nGpus) + i;|int nVisible = 1; CUDACHECK(cudaGetDeviceCount(\&nVisible)); gpus[i] = ((gpu0 != -1 ? gpu0 : localRank*nThreads*nGpus) + i) % nVisible;|' \
            "$2/src/common.cu"
        sed -i 's|const int cudaDev = (gpu0 != -1 ? gpu0 : localRank\*nThreads\*nGpus) + i;|const int cudaDev = ((gpu0 != -1 ? gpu0 : localRank*nThreads*nGpus) + i) % available_devices;|' \
            "$2/src/util.cu"
        grep -q 'nVisible;' "$2/src/common.cu" && grep -q '% available_devices;' "$2/src/util.cu" \
            || { echo "nccl-tests: device lines not patched"; return 1; }
    fi
    make -C "$2/src" -j"$(nproc)" build BUILDDIR="$2/build" BIN_FILES_LIST=all_reduce MPI=0 \
        NCCL_HOME="$3" CUDA_HOME="$4" NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90
}
