"""A trace is added up while it is read, so memory stays bounded whatever its number of events, and every
malformed JSON is one line naming the file and, inside ``traceEvents`` or an Inspector log, the event."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.trace_import import SIZES, measure, write_trace
from tests.support.processes import run_cli
from topo_tune.errors import WorkloadFileError
from topo_tune.workload.file_kinds import read_workload_file

HEAD = '{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": ['
GLOO = '{"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "dur": %s, "args": %s}'
ARGS = '{"Input type": ["float"], "Input Dims": [[4]]}'
INSPECTOR = '{"header": {"rank": 0, "n_ranks": 2}, "coll_perf": {"coll": "AllReduce", "coll_msg_size_bytes": 8, '


def test_a_million_events_import_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    with path.open("w", encoding="utf-8") as out:
        calls = write_trace(out, 1_000_000)
    baseline, peak, _, counted = measure(path)
    assert counted == calls == 500_000
    # Before, every NCCL row was kept until the end: this trace peaked at several hundred MB.
    assert peak < 200, f"peak {peak:.0f} MiB (baseline {baseline:.0f} MiB)"
    assert peak - baseline < 50, f"the import grew the process by {peak - baseline:.0f} MiB"


def test_the_sums_are_per_collective_and_size_not_per_event(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    with path.open("w", encoding="utf-8") as out:
        write_trace(out, 2 * 3 * len(SIZES))  # three calls of each size, each with its kernel
    calls = read_workload_file(path).calls
    assert sorted(size for _, size in calls) == [4 * n for n in SIZES]
    assert {(s.calls, s.timed_calls, s.time_us) for s in calls.values()} == {(3, 3, 3 * 20.25)}


def test_kernels_of_calls_before_the_window_count_the_calls_at_their_mean(tmp_path: Path) -> None:
    op = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms"}
    args = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Out msg nelems": 256}
    events = [{**op, "args": args}, {**op, "args": args}]
    events += [{"ph": "X", "cat": "kernel", "name": "k", "dur": dur, "args": args} for dur in (10, 20, 30)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    [stats] = read_workload_file(path).calls.values()
    assert (stats.calls, stats.timed_calls, stats.time_us) == (2, 2, 40.0)  # 2 calls x 20 us, the kernels' mean


def test_a_gloo_all_gather_is_sized_by_a_world_size_given_after_the_events(tmp_path: Path) -> None:
    event = GLOO.replace("all_reduce", "all_gather") % (5, ARGS)
    path = tmp_path / "t.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [' + event + "], " + '"distributedInfo": {"world_size": 4}}')
    [(key, stats)] = read_workload_file(path).calls.items()
    assert key[1] == 4 * 4 * 4 and stats.time_us == 5


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            HEAD + GLOO % (1, ARGS) + ", " + GLOO % (1, "[" * 100_000 + "]" * 100_000) + "]}",
            r"traceEvents\[1\]: .*nested too deeply",
        ),
        (HEAD + GLOO % ("9" * 5001, ARGS) + "]}", r"traceEvents\[0\]: .*an integer of more than 4300 digits"),
        (HEAD + GLOO % ("Infinity", ARGS) + "]}", r"traceEvents\[0\]: .*Infinity is not a JSON value"),
        (HEAD + GLOO % ("-Infinity", ARGS) + "]}", r"traceEvents\[0\]: .*-Infinity is not a JSON value"),
        (HEAD + GLOO % ("NaN", ARGS) + "]}", r"traceEvents\[0\]: .*NaN is not a JSON value"),
        (HEAD + GLOO % (1, ARGS) + ", " + GLOO % ("1e999", ARGS) + "]}", r"traceEvents\[1\]: dur is inf, not a finite"),
        (HEAD + GLOO % (1, ARGS) + ", " + (GLOO % (1, ARGS))[:30], r"traceEvents\[1\]: truncated"),
        (HEAD + GLOO % (1, ARGS), r"after traceEvents\[0\]: truncated: the JSON ends where ',' or ']'"),
        (
            HEAD + GLOO % (1, ARGS) + " " + GLOO % (1, ARGS) + "]}",
            r"after traceEvents\[0\]: malformed JSON .* got '\{'",
        ),
        ('{"schemaVersion": 1, "traceEvents": {"a": 1}}', "expected '\\[' to open the array traceEvents"),
        ('{"schemaVersion": 1, "traceEvents": []} []', "text after the trace's object"),
        ('{"schemaVersion": 1, "deviceProperties": ' + "[" * 100_000, "nested too deeply"),
        (
            INSPECTOR + '"coll_exec_time_us": 1}}\n' + INSPECTOR + '"coll_exec_time_us": 1e999}}',
            r"record 2: .* not a finite",
        ),
        (INSPECTOR + '"coll_exec_time_us": NaN}}', r"record 1: .*NaN is not a JSON value"),
        (
            INSPECTOR + '"coll_exec_time_us": 1}}\n' + INSPECTOR + '"coll_exec_time_us": ' + "7" * 5001 + "}}",
            r"record 2: .*4300 digits",
        ),
        (INSPECTOR + '"coll_exec_time_us": 1}}\n{"header": ' + "[" * 100_000, r"record 2: .*nested too deeply"),
        (INSPECTOR + '"coll_exec_time_us": 1}}\n' + INSPECTOR, r"record 2: truncated"),
    ],
)
def test_malformed_json_is_one_line_naming_the_file_and_event(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "job.json"
    path.write_text(text)
    with pytest.raises(WorkloadFileError, match=reason) as caught:
        read_workload_file(path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


def test_the_cli_says_one_line_and_fails_where_it_printed_inf(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(INSPECTOR + '"coll_exec_time_us": 1e999}}')
    result = run_cli("workload", "import", str(path))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"topo-tune: error: {path}: record 1: coll_perf.coll_exec_time_us is inf, not a finite number\n"
    )
