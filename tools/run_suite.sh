#!/usr/bin/env bash
# `make test`'s phases, laid out for two cores (benchmarks/results/suite-time.md):
#
#   beside everything  the network-namespace clusters (`pytest tests/netns -m netns`), one at a time, at the
#                      normal CPU priority: they measure links shaped with tbf against absolute rates, so the
#                      CPU must be theirs whenever they want it; most of their time is spent waiting on links;
#   in front, niced    the linters, the type checker, then every other test on TEST_WORKERS xdist workers; these
#                      only ever wait for CPU, so they take what the clusters leave;
#   last               SERIAL_TESTS in one process, once the clusters are done (their real Slurm and init's
#                      Ctrl-C failed beside other work).
#
# The clusters' output is kept in a file and printed whole when they end, so the two streams do not interleave.
# Every phase runs even when one before it failed; the exit status is the first failure's (0 when all passed).
# Usage: tools/run_suite.sh  (from `make test`; BIN, TEST_WORKERS and SERIAL_TESTS come from the Makefile)
set -u
BIN=${BIN:-.venv/bin}
TEST_WORKERS=${TEST_WORKERS:-3}
SERIAL_TESTS=${SERIAL_TESTS:-}
NICE=${NICE:-10}
log=$(mktemp "${TMPDIR:-/tmp}/topo-tune-netns.XXXXXX")
trap 'kill "$netns" 2>/dev/null; rm -f "$log"' EXIT

status=0
record() {  # record STATUS: keep the first failure's status
    [ "$status" -ne 0 ] || status=$1
}
phase() {  # phase NAME COMMAND...: run it at the lower priority, say when and how it ended
    local start=$SECONDS rc
    echo "== $1"
    nice -n "$NICE" "${@:2}"
    rc=$?
    echo "== $1: exit $rc after $((SECONDS - start)) s"
    record "$rc"
}

start=$SECONDS
"$BIN/python" -m pytest tests/netns -m netns --durations=0 >"$log" 2>&1 &
netns=$!
echo "== the network-namespace clusters: started beside the rest, their output follows when they end"

phase "ruff" "$BIN/ruff" check topo_tune tests tools benchmarks
phase "ruff format" "$BIN/ruff" format --check topo_tune tests tools benchmarks
phase "import contracts" "$BIN/lint-imports"
phase "mypy" "$BIN/mypy"
ignored=()
for module in $SERIAL_TESTS; do ignored+=("--ignore=$module"); done
phase "the tests but the clusters and SERIAL_TESTS ($TEST_WORKERS workers)" \
    "$BIN/python" -m pytest -n "$TEST_WORKERS" --dist loadgroup -m "not netns" "${ignored[@]}" --durations=40

wait "$netns"
rc=$?
echo "== the network-namespace clusters: exit $rc after $((SECONDS - start)) s"
cat "$log"
record "$rc"

# shellcheck disable=SC2086 # a list of paths, split on purpose
[ -z "$SERIAL_TESTS" ] || phase "SERIAL_TESTS" "$BIN/python" -m pytest $SERIAL_TESTS
echo "== make test: exit $status after $((SECONDS - start)) s"
exit "$status"
