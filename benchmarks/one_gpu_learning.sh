#!/usr/bin/env bash
# Learning's timing on real NCCL, N ranks sharing one GPU (benchmarks/results/h200-learning.md): builds NCCL
# >= 2.30 from a source tree (ONLY_FUNCS, sm_90) and topo-tune's plugin (tuner and profiler in one library),
# starts MPS, then ROUNDS rounds of the DDP job (benchmarks/ddp_train.py under torchrun, STEPS steps, every
# rank on the one GPU), each round's three arms in a seeded shuffled order:
#   off   the plugin as tuner with the chosen table, no profiler: a job with learning off;
#   arm0  the same table, the profiler timing one call in SAMPLE: learning on, the chosen arm;
#   arm1  the challenger table, timed the same way: learning on, a challenger arm.
# With NCCL_TESTS (an nccl-tests source tree), all_reduce_perf then times both tables over the job's sizes,
# graph-timed, interleaved: the micro-benchmark's winner per size; with COST_ROUNDS=R as well, all_reduce_perf
# without graphs (each call launched by the host, as the DDP job's are), the profiler off and on (timing 1 call
# in SAMPLE), in a seeded shuffled order per round, COST_ITERS (default 200) timed calls per size: learning's
# cost per call. ARMS picks the DDP job's arms (default all three; "off arm0" for the cost alone; ROUNDS=0 for
# none), WARMUP the job's untimed steps, BATCH its batch (default 64: a step of 2-3 ms, mostly its all-reduces), SKIP_MICRO=1 skips the tables' nccl-tests comparison and TUNING sweep. Each run's output and timing records go to
# OUT/runs/<arm>-r<round>/; `python3 -m benchmarks.one_gpu_learning summarize OUT` prints the tables.
# NVLink multicast stays off in every process.
# Usage (repository root, topo-tune importable by python3, nvcc, root for MPS):
#   NCCL_SRC=path/to/nccl NCCL_TESTS=path/to/nccl-tests RANKS_PER_GPU=2 ROUNDS=5 STEPS=1000 SAMPLE=8 \
#       benchmarks/one_gpu_learning.sh OUT
#   ARMS="off arm0" ROUNDS=8 WARMUP=100 COST_ROUNDS=8 SKIP_MICRO=1 ... benchmarks/one_gpu_learning.sh OUT  # the cost
set -u
OUT=${1:?usage: one_gpu_learning.sh OUT}
NCCL_SRC=${NCCL_SRC:?NCCL_SRC must name an NCCL >= 2.30 source tree}
export RANKS_PER_GPU=${RANKS_PER_GPU:-2}
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-1000}
SAMPLE=${SAMPLE:-8}
SEED=${SEED:-1}
ARMS=${ARMS:-off arm0 arm1}
WARMUP=${WARMUP:-5}
BATCH=${BATCH:-64}
COST_ROUNDS=${COST_ROUNDS:-0}
COST_ITERS=${COST_ITERS:-200}
ONLY_FUNCS=${ONLY_FUNCS:-AllReduce Sum f32 * *|AllGather * *|Broadcast * *|SendRecv}
mkdir -p "$OUT/runs" "${NCCL_BUILD:=$OUT/nccl-build}"
OUT=$(cd "$OUT" && pwd)
NCCL_BUILD=$(cd "$NCCL_BUILD" && pwd)
REPO=$(pwd)
PLUGIN=$OUT/plugin/libnccl-tuner-topotune.so  # build_plugin writes it there
# Several ranks on one GPU: NCCL's switch, and at most 128 / N channels each (4 ranks x 64 crashed NCCL 2.30.7).
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_MAX_NCHANNELS=$((128 / RANKS_PER_GPU))
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

source "$REPO/benchmarks/gpu_steps.sh"

# The chosen table keeps NCCL's own choices; the challenger runs ring/LL128 from 2 MiB to 64 MiB (the job's 4,
# 16 and 64 MiB buckets; ring/LL128 ran the 16 MiB all_reduce faster than NCCL's ring/simple in round 1 of
# h200-one-gpu-ranks.md). CHOSEN_FROM= and CHALLENGER_FROM= name other table files (e.g. a promoted
# nccl_tuner.conf); both are copied to OUT/chosen.csv and OUT/challenger.csv, which the runs read.
HEAD='# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff'
CHOSEN=$OUT/chosen.csv
CHALLENGER=$OUT/challenger.csv
if [ -n "${CHOSEN_FROM:-}" ]; then cp "$CHOSEN_FROM" "$CHOSEN" || exit 1; else echo "$HEAD" >"$CHOSEN"; fi
if [ -n "${CHALLENGER_FROM:-}" ]; then
    cp "$CHALLENGER_FROM" "$CHALLENGER" || exit 1
else
    printf '%s\nallreduce,2097153,67108864,ring,ll128,-1,-1,-1\n' "$HEAD" >"$CHALLENGER"
fi

shuffled() {  # shuffled SEED ITEM...: the items in an order drawn from SEED
    python3 -c "import random, sys; a = sys.argv[2:]; random.Random(sys.argv[1]).shuffle(a); print(*a)" "$@"
}

job() {  # job ARM DIR: one DDP run, its timing records in DIR/records
    local arm=$1 dir=$2 table=$CHOSEN
    mkdir -p "$dir/records"
    [ "$arm" = arm1 ] && table=$CHALLENGER
    local env=(NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$table")
    [ "$arm" != off ] && env+=(NCCL_PROFILER_PLUGIN="$PLUGIN" TOPO_TUNE_WORKLOAD_DIR="$dir/records"
        TOPO_TUNE_TIMING_SAMPLE="$SAMPLE" TOPO_TUNE_LEARNING_ARM="${arm#arm}")
    env "${env[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 240 torchrun --standalone --nproc_per_node="$RANKS_PER_GPU" \
        "$REPO/benchmarks/ddp_train.py" --steps "$STEPS" --warmup "$WARMUP" --batch "$BATCH"
}

step versions source_versions
step build-nccl build_nccl || exit 1
step build-plugin build_plugin || exit 1
export LD_PRELOAD=$NCCL_BUILD/lib/libnccl.so.2
mps_start
for round in $(seq 1 "$ROUNDS"); do
    for arm in $(shuffled "$SEED-$round" $ARMS); do
        mkdir -p "$OUT/runs/$arm-r$round"
        TAIL=3 step "runs/$arm-r$round/job" job "$arm" "$OUT/runs/$arm-r$round"
    done
done
if [ -n "${NCCL_TESTS:-}" ]; then
    CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
    unset LD_PRELOAD
    export LD_LIBRARY_PATH=$NCCL_BUILD/lib:${LD_LIBRARY_PATH:-}
    step nccl-tests-build build_nccl_tests "$NCCL_TESTS" "$OUT/nccl-tests-build" "$NCCL_BUILD" "$CUDA_HOME"
    for round in $(seq 1 "$COST_ROUNDS"); do  # learning's cost per call: the profiler off and on, host-launched
        for arm in $(shuffled "cost-$SEED-$round" off on); do
            env=(NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$CHOSEN")
            mkdir -p "$OUT/cost-records-$round"
            [ "$arm" = on ] && env+=(NCCL_PROFILER_PLUGIN="$PLUGIN" TOPO_TUNE_WORKLOAD_DIR="$OUT/cost-records-$round"
                TOPO_TUNE_TIMING_SAMPLE="$SAMPLE" TOPO_TUNE_LEARNING_ARM=0)
            TAIL=2 step "cost-$arm-$round" env "${env[@]}" "$OUT/nccl-tests-build/build/all_reduce_perf" -b 1M -e 64M \
                -f 4 -g "$RANKS_PER_GPU" -n "$COST_ITERS" -w 20 -G 0
        done
    done
    micro_rounds=3
    [ -n "${SKIP_MICRO:-}" ] && micro_rounds=0
    for round in $(seq 1 "$micro_rounds"); do
        for arm in arm0 arm1; do
            table=$CHOSEN
            [ "$arm" = arm1 ] && table=$CHALLENGER
            TAIL=12 step "perf-$arm-$round" env NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$table" \
                "$OUT/nccl-tests-build/build/all_reduce_perf" -b 1M -e 64M -f 4 -g "$RANKS_PER_GPU" -n 100 -w 10 -G 10
        done
    done
    # Item 2 of the one-GPU record: NCCL's own TUNING line for every size of a sweep with the challenger table
    # (a promoted table, when CHALLENGER names one), every rank's line (both ranks log in the one process).
    [ -z "${SKIP_MICRO:-}" ] && TAIL=3 step perf-tuning env NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$CHALLENGER" NCCL_DEBUG=INFO \
        NCCL_DEBUG_SUBSYS=TUNING "$OUT/nccl-tests-build/build/all_reduce_perf" -b 128K -e 128M -f 2 \
        -g "$RANKS_PER_GPU" -n 2 -w 1
fi
mps_stop
echo "== done"
