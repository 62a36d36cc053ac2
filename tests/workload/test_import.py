"""``topo-tune workload import`` on real gloo DDP traces, a synthetic NCCL trace and Inspector log, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import run_cli
from topo_tune.config.cluster import load_cluster_config, loads_cluster_config
from topo_tune.errors import ConfigError, WorkloadFileError
from topo_tune.nccl.collectives import Collective
from topo_tune.tuner.objective import Measurements, SizeSample
from topo_tune.workload.calls import per_rank
from topo_tune.workload.file_kinds import read_workload_file
from topo_tune.workload.json_stream import Limits
from topo_tune.workload.weights import weigh
from topo_tune.workload.workload_block import replace_block

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "workload"
RANKS = [FIXTURES / f"ddp_gloo_rank{r}.json.gz" for r in (0, 1)]
# tests/fixtures/workload/make_traces.py: three Linear layers, 3 steps, bucket_cap_mb=1 on 2 ranks.
PARAMETERS = 512 * 512 + 512 + 512 * 1024 + 1024 + 1024 * 64 + 64


def totals(calls: dict[tuple[Collective, int], Any]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for (collective, size), stats in calls.items():
        n, b = out.get(collective.value, (0.0, 0.0))
        out[collective.value] = (n + stats.calls, b + stats.calls * size)
    return out


def test_the_gloo_ddp_traces_give_every_call_with_its_bytes_once() -> None:
    for path in RANKS:
        calls = read_workload_file(path)
        assert calls.kind == "pytorch-trace" and not calls.skipped
        by = totals(calls.calls)
        # DDP reduces every gradient once per step: first in one bucket, then in the two that bucket_cap_mb cuts
        # after its first step rebuilt them (2363648 and 1050624 bytes).
        assert by["all_reduce"] == (5, 3 * PARAMETERS * 4)
        assert {s for (c, s) in calls.calls if c is Collective.ALL_REDUCE} == {PARAMETERS * 4, 2363648, 1050624}
        # all_gather counts the full buffer (nccl-tests): 1024 float32 per rank × 2 ranks.
        assert by["all_gather"] == (3, 3 * 1024 * 4 * 2)
        # 3 explicit 16 KiB broadcasts, and DDP's own broadcasts of its rebuilt bucket order (7 and 2 int32).
        assert by["broadcast"] == (5, 3 * 4096 * 4 + 7 * 4 + 2 * 4)
    job = per_rank(read_workload_file(p) for p in RANKS)
    assert job.ranks == (0, 1) and job.timed and totals(dict(job.calls))["all_reduce"] == (5, 3 * PARAMETERS * 4)


def test_weights_are_time_shares_and_uncalled_buckets_weigh_zero() -> None:
    weights = weigh(per_rank(read_workload_file(p) for p in RANKS))
    assert weights.source == "trace-durations"
    assert sum(load.weight for load in weights.loads) == pytest.approx(1.0)
    matrix = weights.matrix
    assert set(matrix) == {"all_reduce", "all_gather", "broadcast"}
    assert matrix["all_reduce"]["1M-16M"] > 0 and matrix["all_reduce"]["0-1K"] == 0
    assert matrix["all_reduce"]["16M-4G"] == matrix["all_gather"]["64K-1M"] == 0
    # Time, not bytes: the broadcasts move 0.5% of the bytes but take a visible share of the time.
    assert matrix["broadcast"]["1K-64K"] > 0.01
    assert weights.total_time_us == pytest.approx(sum(load.time_us or 0 for load in weights.loads))
    by_bytes = weigh(per_rank([read_workload_file(RANKS[0])]), baseline=None)
    assert by_bytes.source == "trace-durations"


def test_a_measured_baseline_weighs_by_its_times() -> None:
    job = per_rank(read_workload_file(p) for p in RANKS)
    samples = tuple(
        SizeSample(c, size, 10.0 + size / 1e4, 1.0)
        for c in ("all_reduce", "all_gather", "broadcast")
        for size in (256, 4096, 65536, 1 << 20, 1 << 22)
    )
    weights = weigh(job, baseline=Measurements(samples))
    assert weights.source == "baseline"
    allreduce_time = sum(n * (10.0 + s / 1e4) for s, n in [(PARAMETERS * 4, 1), (2363648, 2), (1050624, 2)])
    row = next(x for x in weights.loads if x.collective is Collective.ALL_REDUCE and x.bucket.name == "1M-16M")
    assert row.time_us == pytest.approx(allreduce_time, rel=0.05)  # log-log between ladder sizes
    partial = Measurements(tuple(s for s in samples if s.collective == "all_reduce"))
    assert weigh(job, baseline=partial).source == "trace-durations", "a baseline missing a collective is not used"


def _trace(tmp_path: Path, events: list[dict[str, Any]], *, name: str = "nccl.json") -> Path:
    path = tmp_path / name
    path.write_text(
        json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 4}, "traceEvents": events})
    )
    return path


def _comms(
    name: str, n_in: int, n_out: int, dtype: str = "BFloat16", cat: str = "cpu_op", dur: float = 5.0
) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": "record_param_comms" if cat == "cpu_op" else f"ncclDevKernel_{name}",
        "ts": 1.0,
        "dur": dur,
        "args": {
            "Collective name": name,
            "In msg nelems": n_in,
            "Out msg nelems": n_out,
            "Group size": 4,
            "dtype": dtype,
        },
    }


def test_nccl_rows_map_every_spelling_and_skip_the_rest(tmp_path: Path) -> None:
    events = [
        _comms("allreduce", 1 << 20, 1 << 20),
        _comms("allreduce_coalesced", 1 << 10, 1 << 10),
        _comms("_allgather_base", 1 << 18, 1 << 20),
        _comms("allgather_into_tensor_coalesced", 256, 1024, dtype="Float"),
        _comms("_reduce_scatter_base", 1 << 20, 1 << 18),
        _comms("reduce_scatter_tensor_coalesced", 1 << 20, 1 << 18),
        _comms("barrier", 1, 1),
        _comms("wait", 0, 0),
        _comms("send", 100, 100),
        _comms("allreduce", 8, 8, dtype="Quaternion"),
        # the kernel of the first all_reduce, with its GPU time; a gloo group beside NCCL is not NCCL's.
        _comms("allreduce", 1 << 20, 1 << 20, cat="kernel", dur=250.0),
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "dur": 9.0,
            "args": {"Input Dims": [[4]], "Input type": ["float"]},
        },
    ]
    calls = read_workload_file(_trace(tmp_path, events))
    assert calls.rank == 3
    got = {(c.value, s): (x.calls, x.timed_calls, x.time_us) for (c, s), x in calls.calls.items()}
    assert got == {
        ("all_reduce", 2 << 20): (1, 1, 250.0),
        ("all_reduce", 2 << 10): (1, 0, 0.0),
        ("all_gather", 2 << 20): (1, 0, 0.0),  # the output: 4 ranks × 2**18 bf16
        ("all_gather", 4096): (1, 0, 0.0),
        ("reduce_scatter", 2 << 20): (2, 0, 0.0),  # the input: the full buffer
    }
    assert dict(calls.skipped) == {
        "barrier": 1,
        "wait": 1,
        "send": 1,
        "allreduce (dtype 'Quaternion' or sizes unreadable)": 1,
        "gloo:all_reduce (a gloo process group beside NCCL)": 1,
    }
    weights = weigh(per_rank([calls]))
    assert weights.source == "bytes", "not every call was timed: no mix of times and bytes"
    assert weights.total_time_us is None


def _inspector(rank: int, coll: str, size: int, time_us: int, n_ranks: int = 8) -> dict[str, Any]:
    return {
        "header": {"id": "0x7f8c496ae9f661", "rank": rank, "n_ranks": n_ranks, "nnodes": 1},
        "metadata": {"inspector_output_format_version": "v4.0", "rec_mechanism": "nccl_profiler_interface"},
        "coll_perf": {"coll": coll, "coll_sn": 1, "coll_msg_size_bytes": size, "coll_exec_time_us": time_us},
    }


def test_an_inspector_log_counts_per_rank_parts_as_nccl_tests_does(tmp_path: Path) -> None:
    records = [
        _inspector(2, "AllReduce", 8 << 20, 400),
        _inspector(2, "AllReduce", 8 << 20, 420),
        _inspector(2, "AllGather", 1 << 20, 300),
        _inspector(2, "ReduceScatter", 1 << 20, 310),
        _inspector(2, "AllToAll", 4096, 20),
        {"header": {"rank": 2, "n_ranks": 8}, "p2p_perf": {"p2p": "Send", "p2p_msg_size_bytes": 64}},
    ]
    path = tmp_path / "inspector.log"
    # One record per line, and one pretty-printed: Inspector's JSON writer and the README's examples.
    path.write_text("\n".join(json.dumps(r) for r in records[:-1]) + "\n" + json.dumps(records[-1], indent=2) + "\n")
    calls = read_workload_file(path)
    assert calls.kind == "nccl-inspector" and calls.rank == 2
    got = {(c.value, s): (x.calls, x.time_us) for (c, s), x in calls.calls.items()}
    assert got == {
        ("all_reduce", 8 << 20): (2, 820.0),
        ("all_gather", 8 << 20): (1, 300.0),
        ("reduce_scatter", 8 << 20): (1, 310.0),
        ("alltoall", 4096): (1, 20.0),
    }
    assert dict(calls.skipped) == {"Send": 1}
    weights = weigh(per_rank([calls]))
    assert weights.source == "trace-durations"
    assert weights.matrix["all_reduce"]["1M-16M"] == pytest.approx(820 / 1450)


def test_a_plugin_record_is_read_and_its_counts_are_lower_bounds(tmp_path: Path) -> None:
    path = tmp_path / "topo-tune-workload.host.42.0.txt"
    path.write_text(
        "topo-tune workload record 1\nprocess host:42 nranks 8 nnodes 1\n"
        "all_reduce 16777216 10 104857600\nall_gather 1024 3 3000\nsend_recv 1024 2 2048\n"
    )
    second = tmp_path / "topo-tune-workload.host.42.1.txt"
    second.write_text(
        "topo-tune workload record 1\nprocess host:42 nranks 2 nnodes 1\nall_reduce 16777216 5 52428800\n"
    )
    job = per_rank(read_workload_file(p) for p in (path, second))
    assert totals(dict(job.calls)) == {"all_reduce": (15, 15 * 10485760), "all_gather": (3, 3000)}, "one process"
    assert job.lower_bound and dict(job.skipped) == {"send_recv": 2}
    bad = tmp_path / "bad.txt"
    bad.write_text("topo-tune workload record 1\nprocess h:1\nall_reduce 1024 2 99999\n")
    with pytest.raises(WorkloadFileError, match=r"bad.txt:3: 99999 bytes over 2 calls"):
        read_workload_file(bad)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a"}, {"ph": "X"', "truncated"),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a"} {"ph": "X"}]}', "malformed JSON"),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a"]}', "malformed JSON"),
        (gzip.compress(b'{"schemaVersion": 1, "traceEvents": []}', mtime=0)[:-12], "not a complete gzip file"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"", "empty"),
        (b"[1, 2, 3]", "not a PyTorch profiler trace, an NCCL Inspector log"),
        (b'{"header": {"rank": 0, "n_ranks": 2}, "coll_perf": {"coll": "AllReduce"}}', "coll_msg_size_bytes"),
    ],
)
def test_bad_files_are_one_line_naming_the_file(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "job.trace"
    path.write_bytes(content)
    with pytest.raises(WorkloadFileError, match=reason) as caught:
        read_workload_file(path)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_huge_input_is_refused_within_its_bounds(tmp_path: Path) -> None:
    events = [{"ph": "X", "name": "gloo:all_reduce", "cat": "user_annotation", "dur": 1, "args": {}}] * 2000
    path = _trace(tmp_path, events)
    with pytest.raises(WorkloadFileError, match="larger than 50000 characters"):
        read_workload_file(path, limits=Limits(max_chars=50_000))
    one_big = _trace(tmp_path, [{"ph": "X", "name": "x" * 300_000}], name="big.json")
    with pytest.raises(WorkloadFileError, match="a single value is longer than 100000 characters"):
        read_workload_file(one_big, limits=Limits(max_value_chars=100_000))


CLUSTER = """\
apiVersion: topo-tune/v1
# the demo's two nodes
backend: sim
workload:
  collectives: {all_reduce: 1}   # a guess
  buckets:
    0-1K: 1

search:
  budget: 4   # keep it short
racks:
  - name: r0
    nodes:
      - {name: n0, gpus: 8}
"""


def test_write_replaces_only_the_workload_block_and_keeps_a_backup(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(CLUSTER)
    result = run_cli("workload", "import", *map(str, RANKS), "--cluster-config", str(config), "--write", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cluster.yaml.bak").read_text() == CLUSTER
    text = config.read_text()
    assert text.startswith("apiVersion: topo-tune/v1\n# the demo's two nodes\nbackend: sim\nworkload:\n")
    assert text.endswith(
        "\nsearch:\n  budget: 4   # keep it short\nracks:\n  - name: r0\n    nodes:\n      - {name: n0, gpus: 8}\n"
    )
    assert "a guess" not in text and "# 5 calls, 10242816 bytes" in text
    cluster = load_cluster_config(config)
    assert cluster.workload.weights is not None and cluster.workload.weights["all_reduce"]["0-1K"] == 0
    assert cluster.workload.collectives["all_reduce"] == pytest.approx(
        json.loads(result.stdout)["collectives"]["all_reduce"], abs=1e-5
    )
    assert cluster.workload.source is not None and "ddp_gloo_rank0.json.gz" in cluster.workload.source
    data = json.loads(result.stdout)
    assert {b["collective"] for b in data["buckets"]} == {"all_reduce", "all_gather", "broadcast"}
    assert data["source"]["weights"] == "trace-durations" and data["skipped"] == {}


def test_a_bad_file_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(CLUSTER)
    broken = tmp_path / "rank1.json.gz"
    broken.write_bytes(RANKS[1].read_bytes()[:5000])
    result = run_cli("workload", "import", str(RANKS[0]), str(broken), "--cluster-config", str(config), "--write")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"topo-tune: error: {broken}: not a complete gzip file")
    assert config.read_text() == CLUSTER and not (tmp_path / "cluster.yaml.bak").exists()
    same = run_cli("workload", "import", str(RANKS[0]), str(RANKS[0]))
    assert same.returncode == 1 and "rank 0 was already imported" in same.stderr


def test_weights_replace_collectives_and_buckets() -> None:
    head = "apiVersion: topo-tune/v1\nworkload:\n  weights: {all_reduce: {1M-16M: 0.75}, broadcast: {0-1K: 0.25}}\n"
    cluster = loads_cluster_config(head)
    assert cluster.workload.collectives == {"all_reduce": 0.75, "broadcast": 0.25}
    with pytest.raises(ConfigError, match="weights replaces buckets"):
        loads_cluster_config(head + "  buckets: {0-1K: 1}\n")


def test_the_block_is_found_in_flow_style_appended_when_missing_and_comments_around_it_stay() -> None:
    block = "workload:\n  weights: {}\n"
    flow = "apiVersion: topo-tune/v1\nworkload: {collectives: {all_reduce: 1},\n  buckets: {0-1K: 0}}\n"
    flow += "# racks\nracks: []\n"
    assert replace_block(flow, block) == "apiVersion: topo-tune/v1\n" + block + "# racks\nracks: []\n"
    assert replace_block("apiVersion: topo-tune/v1", block) == "apiVersion: topo-tune/v1\n" + block
    nested = "search:\n  workload: 3\nworkload:\n  # old\n  collectives: {}\n\n\nracks: []\n"
    assert replace_block(nested, block) == "search:\n  workload: 3\n" + block + "\n\nracks: []\n"
