"""The report as a person sees it: rendered by real headless Chromium, and what it says for each verdict."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from tests.tuner.test_study import study_settings
from tools.report_browser import Chromium, chromium_binary
from topo_tune.errors import ConfigError
from topo_tune.sim import demo_cluster
from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.objective import Objective, WorkloadProfile
from topo_tune.tuner.outputs import ClusterShape, write_outputs
from topo_tune.tuner.report import learning_evidence
from topo_tune.tuner.report.job_comparisons import BEGIN, END, with_comparisons
from topo_tune.tuner.report.page import render_report
from topo_tune.tuner.report.summary_box import weighted_ci
from topo_tune.tuner.sim_evaluator import SimEvaluator, sim_space
from topo_tune.tuner.study import StudyOutcome, run_study

# Large messages only: the demo's rack-grouped ring is then a safe win (weighing every size, it is a trade-off).
OBJECTIVE = Objective(
    WorkloadProfile({"all_reduce": 2, "all_gather": 1}, {"0-1K": 0, "1K-64K": 0, "64K-1M": 0, "1M-16M": 0})
)


CELL = {"arm": 1, "collective": "allreduce", "class_bytes": 2 << 20, "speedup": 1.25, "ci_low": 1.21}
CELL |= {"ci_high": 1.29, "jobs": 6, "decision": "faster", "applies": True}
EVIDENCE = {"id": "cv-0123456789abcdef", "jobs_by_arm": {"0": 6, "1": 7}, "proposable": [1]}
EVIDENCE |= {"divergent": ["train<7>: comm abc: rank 1 ran allreduce 2097152 tree/ll128 7 times, rank 0 8"]}
EVIDENCE |= {"cells": [CELL, CELL | {"class_bytes": 1024, "speedup": 1.01, "ci_low": 0.98, "ci_high": 1.04}
                       | {"decision": "no difference shown", "applies": False}]}  # fmt: skip
EVIDENCE |= {"learning_stopped": True, "learning_stopped_why": "by the controller: job train<7>'s ranks ran ..."}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[StudyOutcome, ClusterShape]:
    cluster = demo_cluster()
    names = cluster.node_names
    racks = {n: cluster.node(n).rack for n in names}
    grouped = sorted(names, key=lambda n: (racks[n], n))
    space = sim_space(cluster, nccl_version="2.28.3", collectives=["all_reduce", "all_gather"], optimized=grouped)
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'demo.db'}"
    outcome = run_study(
        study_settings(url, budget=16, proof_pairs=4),
        space=space,
        objective=OBJECTIVE,
        evaluate=SimEvaluator(cluster),
        candidates=[],
    )
    bandwidth = tuple(tuple(0.0 if a == b else (50.0 if racks[a] == racks[b] else 15.0) for b in names) for a in names)
    pairs = PairMatrix.from_matrices(names, bandwidth, method="test")
    return outcome, ClusterShape(dict.fromkeys(names, 8), pairs, racks)


def write(outcome: StudyOutcome, shape: ClusterShape, directory: Path) -> tuple[str, dict[str, Any]]:
    write_outputs(outcome, directory, shape=shape, nccl_version="2.28.3", topology_fingerprint="fp")
    return (directory / "report.html").read_text(), json.loads((directory / "summary.json").read_text())


def test_the_report_renders_in_headless_chromium_with_every_image_and_no_error(
    demo: tuple[StudyOutcome, ClusterShape], tmp_path: Path
) -> None:
    assert chromium_binary() is not None, "the report test needs Debian's chromium (make chromium installs it)"
    outcome, shape = demo
    assert outcome.chosen is not None, "the demo promotes a configuration"
    promoted_html, promoted = write(outcome, shape, tmp_path / "promoted")
    keep = dataclasses.replace(outcome, chosen=None)
    kept_html, kept = write(keep, shape, tmp_path / "kept")
    with Chromium() as browser:
        for directory, summary in ((tmp_path / "promoted", promoted), (tmp_path / "kept", kept)):
            page = browser.check(directory / "report.html")
            assert page.problems(expect_version=summary["config_version"]) == [], directory.name
            # speedup and busbw per collective, knobs, history, topology
            assert len(page.images) == 7, page.images
        learned = tmp_path / "learned.html"
        learned.write_text(learning_evidence.with_evidence(promoted_html, EVIDENCE, where="--report"))
        page = browser.check(learned)
        assert page.problems(expect_version=promoted["config_version"]) == [] and len(page.images) == 7
        broken = tmp_path / "broken.html"
        broken.write_text(promoted_html.replace("data:image/png;base64,", "data:image/png;base64,AAAA", 1))
        assert any("did not load" in p for p in browser.check(broken).problems()), "the check sees a broken image"
    assert "<script" not in promoted_html and "http://" not in promoted_html and "https://" not in promoted_html
    # Promoted: the verdict, the settings, the order and the commands that use them.
    chosen = promoted["chosen"]
    assert f"Promote: {html.escape(chosen['speedup_text'])}" in promoted_html, "the verdict's one speedup text"
    for key, value in chosen["env"].items():
        assert f"{key}={value}" in promoted_html
    assert f"topo-tune admin rollout create {promoted['config_version']}" in promoted_html
    assert "topo-tune exec --nodes" in promoted_html and "--hostfile hostfile -np 64" in promoted_html
    assert promoted_html.count("[SIMULATED]") >= 7, "every figure's caption says SIMULATED"
    # Kept: no rollout; what came closest, and why it lost.
    assert "class='verdict keep'>Keep NCCL's defaults<" in kept_html
    assert "rollout create" not in kept_html and "What came closest" in kept_html
    best = max(outcome.proofs, key=lambda p: p.speedup)
    assert re.search(rf"Trial {best.trial} \(.*\): {best.speedup:.3f}× in the proof", kept_html)


def test_the_weighted_ci_combines_the_bucket_bounds_by_weight() -> None:
    rows = [
        {"weight": 2.0, "ci_low": 1.1, "ci_high": 1.3},
        {"weight": 1.0, "ci_low": 0.9, "ci_high": 1.0},
        {"weight": 0.0, "ci_low": 0.1, "ci_high": 0.2},  # weighs nothing
    ]
    low, high = weighted_ci(rows) or (0.0, 0.0)
    assert low == pytest.approx(math.exp((2 * math.log(1.1) + math.log(0.9)) / 3))
    assert high == pytest.approx(math.exp((2 * math.log(1.3) + math.log(1.0)) / 3))
    assert weighted_ci([{"ci_low": 1.1, "ci_high": 1.3}]) is None, "no weight: no combined interval claimed"


def test_the_report_takes_summary_fields_it_does_not_know(
    demo: tuple[StudyOutcome, ClusterShape], tmp_path: Path
) -> None:
    outcome, shape = demo
    _, summary = write(dataclasses.replace(outcome, chosen=None), shape, tmp_path)
    summary["trade_off"] = {"trial": 7, "gain": 1.2, "cost": "all_reduce 0-1K 0.97x"}
    for row in summary["buckets"]:
        row["decision_word"] = "not shown"
    del summary["finalists"]
    summary["trials"][3].update(state="timeout", value=None, reason="rank 12 on gpu-02 hung past the deadline")
    summary["trials"][4].update(state="pruned", value=None, reason=None)
    page = render_report(summary, [], outcome=outcome, files=["hostfile"], nodes=["a"], ranks=8)
    listed = page.split("Failed and pruned trials, with the reason:")[1].split("every trial")[0]
    assert "rank 12 on gpu-02 hung past the deadline" in listed and "timeout" in listed
    assert "<td class='l'>4</td>" in listed and "pruned" in listed
    assert "Trade-off candidate" in page and "all_reduce 0-1K 0.97x" in page
    assert "decision_word" in page and "not shown" in page


def refreshed_section(page: str, refreshed: str, *, begin: str, end: str) -> str:
    """The marked section of ``refreshed``, after checking that the rest is ``page``'s, byte for byte."""
    start, stop = page.index(begin), page.index(end) + len(end)
    assert refreshed[:start] == page[:start] and refreshed.endswith(page[stop:])
    return refreshed[start : len(refreshed) - len(page[stop:])]


def test_the_report_shows_what_jobs_measured_once_refreshed_and_nothing_else_changes(
    demo: tuple[StudyOutcome, ClusterShape], tmp_path: Path
) -> None:
    outcome, shape = demo
    page, _ = write(outcome, shape, tmp_path)
    assert "What jobs measured" in page and "No job has compared versions yet" in page
    run = {"index": 0, "pair": 0, "arm": "candidate", "value": 0.5, "node": "n1"}
    job = {"job_id": "train<7>", "candidate": "stable", "candidate_version": "cv-0123456789abcdef"}
    job |= {"against": "defaults", "against_version": "", "metric": "t=(<x>)", "higher_is_better": False}
    job |= {"pairs": 2, "runs": [run] * 4}
    stored = {"job": job, "complete": True, "candidate_median": 0.5, "against_median": 1.0, "gain": 2.0}
    stored |= {"ci_low": 1.9, "ci_high": 2.1, "confidence": 0.98, "decision": "faster", "created_at": "2026-12-02"}
    refreshed = with_comparisons(page, [stored], where="--report")
    section = refreshed_section(page, refreshed, begin=BEGIN, end=END)
    assert "train&lt;7&gt;" in section and "t=(&lt;x&gt;) (lower is better)" in section  # escaped
    assert "stable (cv-0123456789abcdef)" in section and "<tr class='good'>" in section
    assert "1.900–2.100 (98%)" in section and "4/4" in section
    assert with_comparisons(refreshed, [], where="--report") == page  # refreshed again: as init wrote it
    with pytest.raises(ConfigError, match=r"^--report: not a topo-tune report"):
        with_comparisons("<html></html>", [], where="--report")


def test_the_report_shows_a_versions_learning_evidence_once_refreshed_and_nothing_else_changes(
    demo: tuple[StudyOutcome, ClusterShape], tmp_path: Path
) -> None:
    outcome, shape = demo
    page, summary = write(outcome, shape, tmp_path)
    assert "What learning jobs showed" in page and "No learning evidence shown yet" in page
    assert f"topo-tune admin learning evidence {summary['config_version']} --report report.html" in page
    refreshed = learning_evidence.with_evidence(page, EVIDENCE, where="--report")
    section = refreshed_section(page, refreshed, begin=learning_evidence.BEGIN, end=learning_evidence.END)
    assert "<code>cv-0123456789abcdef</code>" in section and "chosen table: 6, challenger 1: 7" in section
    assert (
        "stopped by the controller: job train&lt;7&gt;&#x27;s ranks ran ...: new jobs run the chosen table" in section
    )
    assert "<td>set aside as divergent</td><td>1</td>" in section and "<code>train&lt;7&gt;: comm abc" in section
    for column in ("challenger", "size class", "table applies", "jobs (smaller arm)", "speedup", "decision"):
        assert f">{column}</th>" in section
    faster = "<tr class='good'><td class='l'>1</td><td class='l'>allreduce</td><td class='l'>(1M, 2M]</td>"
    assert faster + "<td class='l'>yes</td><td>6</td><td>1.250</td><td>1.210–1.290</td><td>faster</td></tr>" in section
    same = "<tr><td class='l'>1</td><td class='l'>allreduce</td><td class='l'>(512, 1K]</td><td class='l'>no</td>"
    assert same in section and "<td>no difference shown</td>" in section, "where the table does not apply"
    assert "Proposable: challenger 1." in section
    cleared = learning_evidence.with_evidence(refreshed, EVIDENCE | {"cells": [], "proposable": []}, where="x")
    assert "nothing is compared" in cleared and "Proposable: none." in cleared, "refreshed again, in place"
    with pytest.raises(ConfigError, match=r"^--report: not a topo-tune report with a learning evidence section"):
        learning_evidence.with_evidence("<html></html>", EVIDENCE, where="--report")
