"""End to end on the sim backend: a trace's weights steer ``init``'s proof, and the report names the trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tests.support.processes import run_cli
from tests.test_init import small_demo
from topo_tune.tuner.objective import DEFAULT_BUCKETS, Measurements

pytestmark = pytest.mark.slow

MIB = 1 << 20


def _row(n_in: int, *, cat: str, dur: float) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": "record_param_comms" if cat == "cpu_op" else "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "ts": 0.0,
        "dur": dur,
        "args": {"Collective name": "allreduce", "In msg nelems": n_in, "Out msg nelems": n_in, "dtype": "BFloat16"},
    }


def test_a_trace_at_4_to_16_mib_spends_the_proof_there_and_the_report_names_it(tmp_path: Path) -> None:
    # An NCCL job whose all_reduces are all 4-16 MiB (bf16), each with its kernel's time.
    events = []
    for size, calls, dur in ((4 * MIB, 6, 180.0), (8 * MIB, 3, 330.0), (16 * MIB, 2, 640.0)):
        for _ in range(calls):
            events += [_row(size // 2, cat="cpu_op", dur=20.0), _row(size // 2, cat="kernel", dur=dur)]
    trace = tmp_path / "job-rank0.json"
    trace.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events}))
    config = small_demo(budget=12)
    config["search"].update({"proofPairs": 3, "proofPairsMax": 3, "tunerTable": False})
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(config))

    imported = run_cli("workload", "import", str(trace), "--cluster-config", str(cluster_file), "--write")
    assert imported.returncode == 0, imported.stderr
    weights = yaml.safe_load(cluster_file.read_text())["workload"]["weights"]
    assert weights == {"all_reduce": {b.name: (1.0 if b.name == "1M-16M" else 0.0) for b in DEFAULT_BUCKETS}}

    output = tmp_path / "out"
    result = run_cli("--log-level", "error", "init", "--cluster-config", str(cluster_file), "--output", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    # Every proof pair measured only the weighted bucket's sizes; only that bucket was tested.
    study = optuna.load_study(
        study_name=summary["study"]["name"], storage=f"sqlite:///{output / '.topo-tune' / 'topo-tune.db'}"
    )
    pairs = [json.loads(v) for k, v in study.user_attrs.items() if k.startswith("proof:") and k[-1].isdigit()]
    assert pairs, "the finalist was proven"
    for pair in pairs:
        for side in ("baseline", "candidate"):
            sizes = {s.bytes for s in Measurements.from_json(pair[side]).samples}
            assert sizes and all(MIB < s <= 16 * MIB for s in sizes), sizes
    assert {row["bucket"] for row in summary["buckets"]} == {"1M-16M"}
    # ... and so did every trial of the search, the baseline included.
    trials = [t for t in study.trials if "measurements" in t.user_attrs]
    assert len(trials) >= 6
    for t in trials:
        sizes = {s.bytes for s in Measurements.from_json(t.user_attrs["measurements"]).samples}
        assert sizes and all(MIB < s <= 16 * MIB for s in sizes), (t.number, sizes)
    # The weights' source, in summary.json, on init's output and in the report.
    workload = summary["workload"]
    assert workload["imported"] is True and "job-rank0.json" in workload["source"]
    assert workload["collective_time_us"] == pytest.approx(6 * 180 + 3 * 330 + 2 * 640)
    assert isinstance(workload["predicted_time_ratio"], float)
    if summary["chosen"] is None:
        assert workload["predicted_time_ratio"] == 1.0
    said = " ".join((result.stdout + result.stderr).split())
    assert "workload weights: imported: PyTorch profiler trace: job-rank0.json" in said
    assert "predicted change of the job's collective time" in said
    assert "job-rank0.json" in (output / "report.html").read_text()

    # With the study's database, the same trace is weighed by the measured baseline's times.
    database = f"sqlite:///{output / '.topo-tune' / 'topo-tune.db'}"
    again = run_cli("workload", "import", str(trace), "--database", database, "-o", "json")
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert data["source"]["weights"] == "baseline"
    [row] = [b for b in data["buckets"] if b["weight"] > 0]
    assert row["bucket"] == "1M-16M" and row["weight"] == 1.0 and row["calls"] == 11
    missing = run_cli("workload", "import", str(trace), "--database", database, "--study", "nope")
    assert missing.returncode == 1 and "no study 'nope'" in missing.stderr
