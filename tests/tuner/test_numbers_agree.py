"""Numbers that agree: a speedup sits inside its own interval, reads the same in every output, and every count
the outputs show is the study database's."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import optuna
import pytest

from tests.tuner.test_outputs import LARGE_ONLY, demo_study
from topo_tune.tuner.outputs import _nccl_conf, write_outputs
from topo_tune.tuner.proof import BucketProof
from topo_tune.tuner.report.tables import trial_table
from topo_tune.tuner.speedup_text import precise, speedup_text
from topo_tune.tuner.statistics import Bounds, SequentialDesign, compare
from topo_tune.tuner.study import StudyOutcome
from topo_tune.tuner.study_records import trial_count_line
from topo_tune.tuner.study_summary import bucket_lines, verdict_lines
from topo_tune.tuner.trial_store import A_ROLE, superseded_trials
from topo_tune.versions.version import parse_nccl_conf


def test_the_point_is_inside_running_bounds_that_exclude_the_last_looks_mean() -> None:
    # Two looks whose intervals overlap only above the second look's mean: printed before as
    # "1.435x [1.438, 1.454]"; the point now is restricted to what both looks allowed.
    bounds = Bounds(1.438, 1.454, True, 20, 1.435)
    assert bounds.point == 1.438
    assert speedup_text(bounds.point, (bounds.low, bounds.high), pairs=20, cv=0.01) == "1.438x [1.438, 1.454]"


def test_every_bucket_of_a_sequential_proof_has_its_point_within_its_bounds() -> None:
    rng = random.Random(7)
    design = SequentialDesign(4, 16, 0.05)
    outside_before = 0
    for _ in range(300):
        gain, noise = rng.uniform(0.9, 1.1), rng.uniform(0.001, 0.2)
        pairs = [(1.0, 1.0 / gain * math.exp(rng.gauss(0, noise))) for _ in range(rng.choice((4, 8, 12, 16)))]
        (b,) = design.bounds([pairs])
        assert b.low <= b.point <= b.high
        everything = compare([x for x, _ in pairs], [y for _, y in pairs])
        outside_before += not b.low <= everything.speedup <= b.high
    # The old point (every pair's mean beside the bounds of an earlier look) fell outside them: this is what
    # the test guards against, not a case it never meets.
    assert outside_before > 0


def test_an_interval_too_wide_to_mean_anything_is_said_in_words() -> None:
    assert not precise(0.0, 9410139.772) and not precise(0.5, math.inf) and precise(0.98, 1.05)
    text = speedup_text(1.2, (0.0, 9410139.772), pairs=10, cv=0.853)
    assert text == "not measured precisely (10 pairs, CV 85 %)"
    assert "9410139" not in text


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[StudyOutcome, optuna.Study, Path]:
    db = tmp_path_factory.mktemp("db") / "demo.db"
    outcome, shape = demo_study(f"sqlite:///{db}", LARGE_ONLY)
    out = tmp_path_factory.mktemp("out")
    write_outputs(outcome, out, shape=shape, nccl_version="2.28.3", topology_fingerprint="t")
    study = optuna.load_study(study_name=outcome.name, storage=f"sqlite:///{db}")
    return outcome, study, out


def test_the_cli_lines_summary_and_report_write_each_speedup_the_same_way(
    demo: tuple[StudyOutcome, optuna.Study, Path],
) -> None:
    outcome, _, out = demo
    assert outcome.chosen is not None
    summary = json.loads((out / "summary.json").read_text())
    report = (out / "report.html").read_text()
    lines = "\n".join(verdict_lines(outcome))
    by_bucket: dict[tuple[str, str], BucketProof] = {(b.collective, b.bucket.name): b for b in outcome.chosen.buckets}
    for row in summary["buckets"]:
        b = by_bucket[(row["collective"], row["bucket"])]
        assert row["ci_low"] <= row["speedup"] <= row["ci_high"], row
        assert row["speedup_text"] == b.text
        assert row["speedup_text"] in report
        if b.weight > 0:
            assert row["speedup_text"] in lines
    assert summary["chosen"]["speedup_text"] == outcome.chosen.text
    assert outcome.chosen.text in lines and outcome.chosen.text in report
    interval = outcome.chosen.interval
    assert interval is not None and interval[0] <= outcome.chosen.speedup <= interval[1]
    assert bucket_lines(outcome.chosen)[0].split()[2].endswith("x")
    assert "search best" in lines and "interleaved A/B pairs" in lines


def test_only_the_chosen_finalist_is_promoted(demo: tuple[StudyOutcome, optuna.Study, Path]) -> None:
    outcome, _, out = demo
    summary = json.loads((out / "summary.json").read_text())
    promoted = [f["trial"] for f in summary["finalists"] if f["promoted"]]
    assert outcome.chosen is not None and promoted == [outcome.chosen.trial]
    assert all(
        f["passed"] == next(p for p in outcome.proofs if p.trial == f["trial"]).promoted for f in summary["finalists"]
    )


def test_every_count_the_outputs_show_is_the_study_databases(demo: tuple[StudyOutcome, optuna.Study, Path]) -> None:
    outcome, study, out = demo
    trials = study.get_trials(deepcopy=False)
    gone = superseded_trials(trials)
    counted = [t for t in trials if t.number not in gone]
    after = [t for t in counted if t.user_attrs.get(A_ROLE) in ("table", "option", "per_size")]
    finalists = {int(k.split(":")[1]) for k in study.user_attrs if k.startswith("proof:") and k.endswith(":0")}
    counts = json.loads((out / "summary.json").read_text())["counts"]
    assert counts["trials"] == len(counted) == len(json.loads((out / "summary.json").read_text())["trials"])
    assert counts["after_budget"] == len(after) and counts["in_budget"] == len(counted) - len(after)
    assert counts["finalists"] == len(finalists) == len(outcome.proofs)
    line = trial_count_line(outcome, 24)
    assert line.startswith(f"{len(counted)} trials: {len(counted) - len(after)} of the search budget of 24 (1 baseline")
    assert "sampleds" not in line
    if after:
        assert f"{len(after)} per-size/table trial" in line
    assert outcome.chosen is not None
    prefix = f"proof:{outcome.chosen.trial}:"
    pairs = sum(1 for k in study.user_attrs if k.startswith(prefix) and k.removeprefix(prefix).isdigit())
    for row in json.loads((out / "summary.json").read_text())["buckets"]:
        assert row["pairs"] == pairs


def test_option_trials_with_their_bases_settings_show_the_table_rows_that_differ() -> None:
    table = "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n"
    env = {"NCCL_MIN_NCHANNELS": "8"}
    trials = [
        {
            "number": 1,
            "role": "option",
            "state": "complete",
            "env": env,
            "tuner_table": table + "allreduce,0,65536,tree,ll,-1,2,16,-1,-1\n",
        },
        {
            "number": 2,
            "role": "option",
            "state": "complete",
            "env": env,
            "tuner_table": table + "allreduce,0,65536,ring,ll128,-1,2,16,-1,-1\n",
        },
    ]
    html = trial_table({"trials": trials})
    assert "MIN_NCHANNELS=8 + table: allreduce,0,65536,tree,ll" in html
    assert "MIN_NCHANNELS=8 + table: allreduce,0,65536,ring,ll128" in html


def test_keeping_the_defaults_writes_a_commented_nccl_conf_never_an_empty_one() -> None:
    text = _nccl_conf({})
    assert text.startswith("# NCCL's defaults") and parse_nccl_conf(text, strict=True) == {}
