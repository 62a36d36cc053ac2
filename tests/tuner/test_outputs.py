"""Outputs: every file validated as its reader reads it (NCCL, the tuner plugin, launchers, the report)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.plugin.nccl_tuner_harness import ALLREDUCE, LL, LOG_WARN, RING, SIMPLE, TunerLibrary, nccl_like_table
from tests.tuner.landscape import NODES, Landscape, synthetic_space
from tests.tuner.output_writer import shape
from tests.tuner.test_study import study_settings, synthetic_objective
from topo_tune.plugin import build_plugin
from topo_tune.sim import demo_cluster
from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.objective import Objective, WorkloadProfile
from topo_tune.tuner.outputs import ClusterShape, write_outputs
from topo_tune.tuner.sim_evaluator import SimEvaluator, sim_space
from topo_tune.tuner.study import StudyOutcome, run_study
from topo_tune.tuner.timeout_advice import advise, latencies_of
from topo_tune.versions.version import ConfigVersion, parse_nccl_conf

ROOT = Path(__file__).resolve().parents[2]

TOPO_XML = '<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0" class="0x030200"/></cpu></system>\n'


# The demo's rack-grouped ring doubles large collectives but slows tree-sized all_reduce messages: a workload of
# large messages only (what weighs) makes it a safe win; with every bucket weighed it is a trade-off.
LARGE_ONLY = {"0-1K": 0.0, "1K-64K": 0.0, "64K-1M": 0.0, "1M-16M": 0.0}


def demo_study(url: str, buckets: dict[str, float]) -> tuple[StudyOutcome, ClusterShape]:
    cluster = demo_cluster()
    names = cluster.node_names
    grouped = [n for n in names if cluster.node(n).rack == "rack-a"] + [
        n for n in names if cluster.node(n).rack == "rack-b"
    ]
    space = sim_space(cluster, nccl_version="2.28.3", collectives=["all_reduce", "all_gather"], optimized=grouped)
    outcome = run_study(
        study_settings(url, budget=24),
        space=space,
        objective=Objective(WorkloadProfile({"all_reduce": 2, "all_gather": 1}, buckets)),
        evaluate=SimEvaluator(cluster),
        candidates=[],
    )
    bandwidth = tuple(
        tuple(0.0 if a == b else (50.0 if cluster.node(a).rack == cluster.node(b).rack else 15.0) for b in names)
        for a in names
    )
    return outcome, ClusterShape({n: 8 for n in names}, PairMatrix.from_matrices(names, bandwidth, method="test"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[StudyOutcome, ClusterShape]:
    return demo_study(f"sqlite:///{tmp_path_factory.mktemp('db') / 'demo.db'}", LARGE_ONLY)


def test_a_trade_off_is_named_with_what_would_accept_it_and_its_files_are_not_the_result(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    outcome, shape = demo_study(f"sqlite:///{tmp_path_factory.mktemp('db') / 'demo.db'}", {})
    # The rack-grouped ring loses in a tree-sized all_reduce bucket: named as the trade-off, never the result,
    # which is NCCL's defaults or a configuration shown safe in every bucket (a smaller win).
    assert outcome.tradeoff is not None and outcome.tradeoff.proof.speedup > 1.2
    assert outcome.chosen is None or (
        outcome.chosen.promoted and outcome.chosen.speedup < outcome.tradeoff.proof.speedup
    )
    written = write_outputs(
        outcome, tmp_path, shape=shape, nccl_version="2.28.3", topology_fingerprint="t", plots=False
    )
    result = parse_nccl_conf((tmp_path / "nccl.conf").read_text(), strict=False)
    assert result == (dict(outcome.chosen.config.env) if outcome.chosen else {}), "the result: the chosen or defaults"
    assert "tradeoff/nccl.conf" not in written.config_version.files and "nccl.conf" in written.config_version.files
    alternative = parse_nccl_conf((tmp_path / "tradeoff" / "nccl.conf").read_text(), strict=True)
    assert alternative == dict(outcome.tradeoff.proof.config.env)
    hosts = [line for line in (tmp_path / "tradeoff" / "hostfile").read_text().splitlines() if line[:1] != "#"]
    assert list(dict.fromkeys(hosts)) == list(outcome.tradeoff.proof.config.rank_order.nodes)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["result"] == ("promote" if outcome.chosen else "keep NCCL's defaults")
    assert (summary["chosen"] is None) == (outcome.chosen is None)
    trade = summary["tradeoff"]
    assert trade["trial"] == outcome.tradeoff.proof.trial and trade["files"] == "tradeoff"
    slow = next(r for r in trade["buckets"] if (r["collective"], r["bucket"]) == ("all_reduce", "1M-16M"))
    assert slow["decision"] in ("slower", "not shown safe") and slow["ci_low"] < 0.98 <= slow["ci_high"] + 0.05
    assert {"collective": "all_reduce", "bucket": "1M-16M"} in trade["not_shown_safe"]
    assert any(a.startswith("search.maxLoss: ") for a in trade["accepted_by"])
    assert trade["accepted_by_max_loss"] > 1 - slow["ci_low"] - 0.001
    report = (tmp_path / "report.html").read_text()
    assert "Trade-off (not the result)" in report and "search.maxLoss" in report
    # A later run that finds no trade-off leaves no stale alternative behind.
    write_outputs(
        dataclasses.replace(outcome, tradeoff=None),
        tmp_path,
        shape=shape,
        nccl_version="2.28.3",
        topology_fingerprint="t",
        plots=False,
    )
    assert not (tmp_path / "tradeoff").exists()


def test_a_promoted_result_writes_every_file_as_its_reader_reads_it(
    demo: tuple[StudyOutcome, ClusterShape], tmp_path: Path
) -> None:
    outcome, shape = demo
    assert outcome.chosen is not None
    latencies = latencies_of(outcome)
    assert set(latencies) == {"all_reduce", "all_gather"} and len(latencies["all_reduce"]) >= 10
    written = write_outputs(
        outcome,
        tmp_path,
        shape=shape,
        nccl_version="2.28.3",
        topology_fingerprint="fp-1",
        topology_xml=TOPO_XML,
        advice=advise(latencies),
    )
    settings = parse_nccl_conf((tmp_path / "nccl.conf").read_text(), strict=True)
    assert settings == dict(outcome.chosen.config.env)
    rank_map = json.loads((tmp_path / "rankmap.json").read_text())
    chosen_nodes = list(outcome.chosen.config.rank_order.nodes)
    assert rank_map["planned"]["node_order"] == chosen_nodes and rank_map["world_size"] == 64
    assert [r["rank"] for r in rank_map["ranks"]] == list(range(64))
    assert [r["node"] for r in rank_map["ranks"]][::8] == chosen_nodes, "ranks contiguous per node, in order"
    # The rack-grouped order crosses the slow spine twice, NCCL's natural one at every hop.
    assert rank_map["planned"]["ring_bottleneck_gbps"] == 15.0 and rank_map["naive"]["ring_bottleneck_gbps"] == 15.0
    hosts = [line for line in (tmp_path / "hostfile").read_text().splitlines() if not line.startswith("#")]
    assert hosts == [n for n in chosen_nodes for _ in range(8)], "one line per rank, Open MPI's sequential mapper"
    ET.fromstring((tmp_path / "topology.xml").read_text())  # re-imports
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["simulated"] is True and summary["result"] == "promote"
    assert summary["decision_rule"]["max_loss"] == 0.02 and summary["tradeoff"] is None
    assert summary["config_version"] == written.config_version.id
    assert summary["chosen"]["speedup"] == pytest.approx(outcome.chosen.speedup)
    row = next(r for r in summary["buckets"] if r["bucket"] == "16M-4G" and r["collective"] == "all_reduce")
    proof = next(b for b in outcome.chosen.buckets if b.bucket.name == "16M-4G" and b.collective == "all_reduce")
    assert (
        row["p_value"] == pytest.approx(proof.comparison.p_value) and row["ci_low"] <= row["speedup"] <= row["ci_high"]
    )
    assert row["decision"] == "faster" and row["ci_low"] >= 0.98 and row["weight"] == 2.0 and row["pairs"] >= 6
    assert all(r["decision"] in ("faster", "no difference shown") for r in summary["buckets"] if r["weight"] > 0)
    assert len(summary["trials"]) == len(outcome.trials)
    assert summary["timeout_advice"]["process_group_timeout_s"] >= 300
    report = (tmp_path / "report.html").read_text()
    assert "SIMULATED" in report
    images = ["speedup-all_reduce.png", "busbw-all_reduce.png", "knobs.png", "history.png", "topology.png"]
    for image in images:
        png = (tmp_path / "plots" / image).read_bytes()
        assert png.startswith(b"\x89PNG")
        assert f"data-name='{image}'" in report, "every figure is inline in the report"
    assert "src='plots/" not in report, "the report needs no other file"
    version = written.config_version
    assert version.files["nccl.conf"] == (tmp_path / "nccl.conf").read_text()
    assert version.provenance["study"] == outcome.name and version.provenance["simulated"] == "true"
    again = write_outputs(
        outcome,
        tmp_path / "again",
        shape=shape,
        nccl_version="2.28.3",
        topology_fingerprint="fp-1",
        topology_xml=TOPO_XML,
        plots=False,
    )
    assert again.config_version.id == version.id, "same settings, same content-addressed id"
    assert ConfigVersion(files=dict(version.files)).id == version.id


def test_the_tuner_table_is_read_by_the_plugin_without_a_warning_and_followed(
    demo: tuple[StudyOutcome, ClusterShape], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome, shape = demo
    write_outputs(outcome, tmp_path, shape=shape, nccl_version="2.28.3", topology_fingerprint="fp-1", plots=False)
    table_path = tmp_path / "nccl_tuner.conf"
    rows = [line.split(",") for line in table_path.read_text().splitlines() if line and not line.startswith("#")]
    assert rows, "the demo's promoted all_reduce buckets give rows"
    for row in rows:
        assert len(row) == 10 and row[0] in ("allreduce", "allgather") and row[6:8] == ["8", "64"]
        assert int(row[5]) == -1 or int(row[5]) > 0
    library = TunerLibrary(build_plugin(tmp_path / "lib").path)
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(table_path))
    comm = library.init(5, n_ranks=64, n_nodes=8)
    try:
        assert not [m for m in comm.messages(LOG_WARN) if "line" in m], comm.messages(LOG_WARN)
        assert any(f"bound {len(rows)} of {len(rows)} rows" in m for m in comm.messages())
        row = next(r for r in rows if r[0] == "allreduce")
        wanted = ({"ring": RING}.get(row[3], -1), {"ll": LL, "simple": SIMPLE}.get(row[4], -1))
        table = nccl_like_table()
        channels = comm.coll_info(ALLREDUCE, int(row[2]), table)
        if -1 not in wanted:
            assert table.nccl_choice() == wanted
        assert channels == (int(row[5]) if int(row[5]) > 0 else 0)
    finally:
        library.finalize_all()


def test_without_bucket_rows_no_table_ships_that_the_plugin_never_ran(
    demo: tuple[StudyOutcome, ClusterShape], tmp_path: Path
) -> None:
    outcome, shape = demo
    assert outcome.chosen is not None and not outcome.chosen.config.tuner_table
    derived, written = (
        write_outputs(
            outcome,
            tmp_path / name,
            shape=shape,
            nccl_version="2.28.3",
            topology_fingerprint="fp-1",
            plots=False,
            table_bucket_rows=rows,
        )
        for name, rows in (("rows", True), ("none", False))
    )
    assert "nccl_tuner.conf" in derived.config_version.files, "with bucket rows, the promoted buckets give rows"
    table = (tmp_path / "none" / "nccl_tuner.conf").read_text()
    assert [line for line in table.splitlines() if not line.startswith("#")] == []
    assert "nccl_tuner.conf" not in written.config_version.files
    assert written.config_version.files["nccl.conf"] == derived.config_version.files["nccl.conf"]


def test_keeping_the_defaults_writes_only_the_site_settings(tmp_path: Path) -> None:
    space = synthetic_space()
    outcome = run_study(
        study_settings(f"sqlite:///{tmp_path / 'flat.db'}", budget=10),
        space=space,
        objective=synthetic_objective(),
        evaluate=Landscape(flat=True),
    )
    assert outcome.chosen is None
    written = write_outputs(
        outcome,
        tmp_path / "out",
        shape=ClusterShape(
            {n: 4 for n in NODES},
            PairMatrix.from_matrices(NODES, [[0.0 if a == b else 40.0 for b in NODES] for a in NODES], method="test"),
        ),
        nccl_version="2.28.3",
        topology_fingerprint="fp",
        plots=False,
    )
    assert parse_nccl_conf((tmp_path / "out" / "nccl.conf").read_text(), strict=True) == dict(space.site_fixed)
    assert set(written.config_version.files) == {"nccl.conf"}, "no table, no rank map: NCCL's own choices stand"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["result"] == ("promote" if outcome.chosen else "keep NCCL's defaults")
    assert (summary["chosen"] is None) == (outcome.chosen is None)
    assert json.loads((tmp_path / "out" / "rankmap.json").read_text())["planned"]["node_order"] == list(NODES)


def test_outputs_that_cannot_all_be_written_leave_the_previous_ones_whole(tmp_path: Path) -> None:
    # A disk that fills up while init writes: the outputs of the previous run must stay usable, as a set.
    database = f"sqlite:///{tmp_path / 'study.db'}"
    settings = study_settings(database, budget=4, finalists=1, proof_pairs=2)
    outcome = run_study(settings, space=synthetic_space(), objective=synthetic_objective(), evaluate=Landscape())
    out = tmp_path / "out"
    write_outputs(outcome, out, shape=shape(), nccl_version="2.28.3", topology_fingerprint="t", plots=False)
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert len((out / "summary.json").read_bytes()) > 4096 > len((out / "nccl.conf").read_bytes())
    child = subprocess.run(
        [sys.executable, "-m", "tests.tuner.output_writer", database, str(out), "4096"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 3, child.stderr[-2000:]
    assert f"{out}/" in child.stderr and ": cannot write it: File too large" in child.stderr, child.stderr[-2000:]
    after = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before, "no file cut short, none from the new set next to old ones, no scratch file left"
    json.loads(after["summary.json"])
