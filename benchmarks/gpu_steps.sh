# Shell functions the GPU harnesses (multi_gpu_job.sh, one_gpu_ranks.sh) share; sourced, never run.
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
