#!/usr/bin/env bash
# The whole GPU record of benchmarks/results/h200-multi-gpu-job.md on one host with N GPUs (N = what torch
# sees; one GPU works too, as a dry run whose communicators have one rank), or of
# benchmarks/results/h200-one-gpu-ranks.md with RANKS_PER_GPU ranks sharing each GPU (NCCL >= 2.30 where torch
# loads it, MPS running: benchmarks/one_gpu_job.sh sets that up):
#   1. a controller and one nccl agent (RANKS_PER_GPU workers per GPU), `plugin build`, one `admin bench run`;
#   2. benchmarks/ddp_train.py once through `exec --record-workload` with its profiler trace, both imported
#      with `topo-tune workload import`;
#   3. nccl-tests all_reduce_perf 128 KiB-4 MiB, graph-timed: plugin not loaded / empty table / counting,
#      interleaved, ROUNDS rounds (needs NCCL_TESTS=<nccl-tests source tree>; built here against NCCL_HOME,
#      default the nvidia-nccl wheel torch loads; nothing fetched);
#   4. `topo-tune init` with graph timing, rollout of the resulting version to the node, then the job under
#      torchrun through `topo-tune exec --compare VERSION --against defaults`; nccl-tests with the promoted
#      table and NCCL's TUNING log.
# Every step's output goes to OUT/<step>.log and a line `== step rc=... wall=...` to stdout; a failed step
# does not stop the later ones. NVLink multicast stays off in every process this starts.
#
# SKIP_RECORD=1 skips step 2, ROUNDS=0 step 3's rounds (nccl-tests is still built for step 4 with NCCL_TESTS);
# SKIP_INIT=1 skips step 4, SKIP_ROLLOUT=1 all of step 4 after init; BENCH_ONLY=1 stops after step 1's
# benchmark of NCCL's own choices. WORKER_REUSE=1 runs benchmarks/worker_reuse.py (fresh against kept
# workers, RANKS_PER_GPU ranks on each GPU) after step 1.
# Usage (repository root, topo-tune importable by python3):
#   NCCL_TESTS=path/to/nccl-tests PAIRS=10 BUDGET=16 ROUNDS=3 [RANKS_PER_GPU=1] benchmarks/multi_gpu_job.sh OUT
set -u
OUT=${1:?usage: multi_gpu_job.sh OUT}
PAIRS=${PAIRS:-10}
BUDGET=${BUDGET:-16}
PROOF_PAIRS=${PROOF_PAIRS:-5}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-30}
PORT=${PORT:-50551}
RANKS_PER_GPU=${RANKS_PER_GPU:-1}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# Jobs and nccl-tests with several ranks on a GPU need NCCL's switch (the agent sets it for its own workers).
[ "$RANKS_PER_GPU" -gt 1 ] && export NCCL_MULTI_RANK_GPU_ENABLE=1
TOPO_TUNE_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
export TOPO_TUNE_TOKEN TOPO_TUNE_CONTROLLER=127.0.0.1:$PORT
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
NRANKS=$((NGPU * RANKS_PER_GPU))
NODE=$(hostname)
TT=(python3 -m topo_tune)
PLUGIN=$OUT/plugin/libnccl-tuner-topotune.so
CONFIG_DIR=$OUT/agent-config
METRIC='step_time_ms: ([0-9.]+)'
JOB=(torchrun --standalone --nproc_per_node="$NRANKS" "$REPO/benchmarks/ddp_train.py" --steps "$STEPS")

source "$REPO/benchmarks/gpu_steps.sh"

versions() {
    gpu_versions
    nvidia-smi topo -m
}
step versions versions

# 1. controller, one agent (RANKS_PER_GPU workers per GPU), the plugin.
"${TT[@]}" controller serve --listen "127.0.0.1:$PORT" --database "sqlite:///$OUT/controller.db" \
    --agent-config-dir "$CONFIG_DIR" --heartbeat-interval 1 --heartbeat-expiry 10 >"$OUT/controller.log" 2>&1 &
CONTROLLER=$!
"${TT[@]}" agent run --backend nccl --controller "127.0.0.1:$PORT" --node-name "$NODE" --rack r0 \
    --address 127.0.0.1 --state-dir "$OUT/agent" --config-dir "$CONFIG_DIR" --ranks-per-gpu "$RANKS_PER_GPU" \
    --worker-env NCCL_NVLS_ENABLE=0 --worker-env TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    --worker-env NVSHMEM_DISABLE_NVLS=1 >"$OUT/agent.log" 2>&1 &
AGENT=$!
trap 'kill $AGENT $CONTROLLER 2>/dev/null; wait 2>/dev/null' EXIT
python3 - "$PORT" <<'EOF'
import socket, sys, time
for _ in range(120):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.5)
EOF
cat >"$OUT/cluster.yaml" <<EOF
apiVersion: topo-tune/v1
kind: Cluster
metadata:
  name: h200-x$NGPU
controller:
  address: 127.0.0.1:$PORT
backend: nccl
racks:
  - name: r0
    nodes:
      - {name: $NODE, gpus: $NGPU}
workload:
  collectives: {all_reduce: 1}
search:
  budget: $BUDGET
  knobs: [channels, nthreads, buffsize]
  minBytes: 1M
  maxBytes: 64M
  stepFactor: 4
  rungs: 1
  finalists: 2
  proofPairs: $PROOF_PAIRS
  iters: 20
  warmupIters: 5
  cudaGraph: true
  jobDeadline: 120s
EOF
step plugin-build "${TT[@]}" plugin build --output "$OUT/plugin"
for _ in $(seq 1 60); do  # the agent registered and ready (bounded: a later step names what is missing)
    "${TT[@]}" admin nodes 2>/dev/null | grep -qi "$NODE.*ready" && break
    sleep 1
done
# The agent's ranks with NCCL's own choices (no table, no nccl.conf): 1 KiB-64 MiB, graph-timed.
TAIL=30 step bench-defaults "${TT[@]}" admin bench run --nodes "$NODE" -b 1K -e 64M -f 4 --cuda-graph --deadline 120
[ -n "${BENCH_ONLY:-}" ] && { echo "== done (BENCH_ONLY)"; exit 0; }
if [ -n "${WORKER_REUSE:-}" ]; then
    TAIL=12 step worker-reuse python3 "$REPO/benchmarks/worker_reuse.py" --backend nccl --ranks "$NRANKS" \
        --ranks-per-gpu "$RANKS_PER_GPU" --jobs 10
fi

# 2. the job's workload: the plugin's counts and the profiler trace of the same run, each imported.
[ -z "${SKIP_RECORD:-}" ] && NCCL_DEBUG=VERSION step record "${TT[@]}" exec --nodes "$NODE" --node "$NODE" --config-dir "$CONFIG_DIR" --tuner-plugin "$PLUGIN" \
    --job-id "record-$$" --record-workload "$OUT/plugin-counts" -- "${JOB[@]}" --profile-dir "$OUT/trace"
if [ -z "${SKIP_RECORD:-}" ]; then
    TAIL=60 step import-trace "${TT[@]}" workload import "$OUT"/trace/rank*.json.gz
    TAIL=60 step import-counts "${TT[@]}" workload import "$OUT"/plugin-counts/*
    "${TT[@]}" workload import "$OUT"/trace/rank*.json.gz -o json >"$OUT/import-trace.json" 2>&1
    "${TT[@]}" workload import "$OUT"/plugin-counts/* -o json >"$OUT/import-counts.json" 2>&1
fi

# 3. the plugin's cost in nccl-tests: not loaded / empty table / counting, interleaved.
if [ -n "${NCCL_TESTS:-}" ]; then
    NCCL_HOME=${NCCL_HOME:-$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])')}
    CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
    step nccl-tests-build build_nccl_tests "$NCCL_TESTS" "$OUT/nccl-tests-build" "$NCCL_HOME" "$CUDA_HOME"
    PERF=$OUT/nccl-tests-build/build/all_reduce_perf
    export LD_LIBRARY_PATH=$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}
    echo '# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff' \
        >"$OUT/empty-table.csv"
    for round in $(seq 1 "$ROUNDS"); do
        step "perf-off-$round" env -u NCCL_TUNER_PLUGIN "$PERF" -b 128K -e 4M -f 2 -g "$NRANKS" -n 200 -w 20 -G 20
        step "perf-empty-$round" env NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$OUT/empty-table.csv" \
            NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING "$PERF" -b 128K -e 4M -f 2 -g "$NRANKS" -n 200 -w 20 -G 20
        mkdir -p "$OUT/perf-counts-$round"
        step "perf-count-$round" env NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$OUT/empty-table.csv" \
            TOPO_TUNE_WORKLOAD_DIR="$OUT/perf-counts-$round" "$PERF" -b 128K -e 4M -f 2 -g "$NRANKS" -n 200 -w 20 -G 20
    done
fi

# 4. init with graph timing, rollout, the job's own A/B, the promoted table in nccl-tests.
[ -z "${SKIP_INIT:-}" ] && step init "${TT[@]}" init --cluster-config "$OUT/cluster.yaml" --output "$OUT/result" --node-timeout 90
VERSION=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("config_version") or "")' \
    "$OUT/result/summary.json" 2>/dev/null)
echo "== version: ${VERSION:-(none)}"
[ -n "${SKIP_ROLLOUT:-}" ] && { echo "== done (SKIP_ROLLOUT)"; exit 0; }
if [ -n "$VERSION" ] && [ -z "${SKIP_INIT:-}" ]; then
    if [ -f "$OUT/result/tradeoff/nccl.conf" ]; then
        # Defaults kept: the named best trade-off goes out as a non-default version (its own files).
        step rollout "${TT[@]}" admin rollout create --file "nccl.conf=$OUT/result/tradeoff/nccl.conf" \
            --file "nccl_tuner.conf=$OUT/result/tradeoff/nccl_tuner.conf" --no-canary -y
        VERSION=$(grep -o 'cv-[0-9a-f]*' "$OUT/rollout.log" | head -n 1)
        echo "== trade-off version: ${VERSION:-(none)}"
    else
        step rollout "${TT[@]}" admin rollout create "$VERSION" --no-canary -y
    fi
    step rollout-wait "${TT[@]}" admin rollout status --wait
fi

if [ -n "$VERSION" ] && [ -z "${SKIP_INIT:-}" ]; then
    TAIL=40 step compare "${TT[@]}" exec --nodes "$NODE" --node "$NODE" --config-dir "$CONFIG_DIR" \
        --tuner-plugin "$PLUGIN" --job-id "compare-$$" --compare "$VERSION" --against defaults \
        --pairs "$PAIRS" --metric "$METRIC" -- "${JOB[@]}"
fi

if [ -n "${NCCL_TESTS:-}" ] && [ -z "${SKIP_INIT:-}" ]; then
    TABLE=$OUT/result/nccl_tuner.conf
    step perf-promoted-table env NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$TABLE" \
        TOPO_TUNE_WORKLOAD_DIR="$OUT/perf-counts-promoted" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
        "$PERF" -b 128K -e 4M -f 2 -g "$NRANKS" -n 20 -w 5
fi
echo "== done"
