# Shell functions the GPU harnesses (multi_gpu_job.sh, one_gpu_ranks.sh, one_gpu_job.sh) share; sourced, never run.
# They write into $OUT, which the sourcing script sets.

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
