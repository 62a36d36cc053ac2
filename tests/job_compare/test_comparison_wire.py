"""A job's comparison survives the admin API's wire: a node's record reaches the controller's edge as it was sent,
and the comparison the controller answers reads back as the one it stored, complete or not
(``wire/job_comparisons.py``); ``-o json`` and the report print the controller's message as it was."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from topo_tune.controller.api.messages import from_proto_job_comparison
from topo_tune.errors import ControllerError
from topo_tune.jobs.compare.comparison_record import ComparisonHeader, StoredComparison
from topo_tune.jobs.compare.schedule import Arm, arm_schedule
from topo_tune.jobs.compare.summary import RunValue, summarise
from topo_tune.wire import job_comparisons as wire
from topo_tune.wire.plain_data import to_data

AT = datetime(2026, 12, 3, 9, 30, 15, 250_000, tzinfo=UTC)
HEADER = ComparisonHeader(
    job_id="train-9",
    candidate="stable",
    candidate_version="cv-0123456789abcdef",
    against="defaults",
    against_version="",
    metric=r"tokens/s=([0-9.]+)",
    higher_is_better=True,
    pairs=3,
    nodes=("n1", "n2"),
    candidate_order=("n2", "n1"),
    against_order=("n1", "n2"),
)
RUNS = tuple(
    RunValue(run.index, run.pair, run.arm, (2.0 if run.arm is Arm.CANDIDATE else 1.0) + 0.01 * run.pair, "n1")
    for run in arm_schedule(HEADER.job_id, HEADER.pairs)
)
COMPLETE = StoredComparison(
    id="jc-0123456789abcdef",
    header=HEADER,
    runs=RUNS,
    figures=summarise(RUNS, higher_is_better=True),
    created_at=AT,
    completed_at=AT,
)
INCOMPLETE = dataclasses.replace(COMPLETE, runs=RUNS[:2], figures=None, completed_at=None)


def test_a_node_s_record_reaches_the_controller_s_edge_as_sent() -> None:
    request = wire.job_comparison_request_to_proto(HEADER, RUNS[:3])
    assert from_proto_job_comparison(request) == (HEADER, list(RUNS[:3]))


@pytest.mark.parametrize("stored", [COMPLETE, INCOMPLETE], ids=["complete", "incomplete"])
def test_a_comparison_reads_back_as_the_controller_stored_it(stored: StoredComparison) -> None:
    sent = wire.job_comparison_to_proto(stored)
    assert sent.complete is stored.complete and sent.comparison_id == stored.id
    read = wire.job_comparison_from_proto(sent)
    assert read == stored
    assert wire.job_comparison_data(read) == to_data(sent), "-o json prints the controller's message as it was"


def test_a_word_this_version_does_not_know_is_named() -> None:
    sent = wire.job_comparison_to_proto(COMPLETE)
    sent.decision = "much faster"
    with pytest.raises(ControllerError, match=r"jc-0123456789abcdef: .* unknown decision 'much faster'"):
        wire.job_comparison_from_proto(sent)
    sent = wire.job_comparison_to_proto(INCOMPLETE)
    sent.job.runs[0].arm = "third"
    with pytest.raises(ControllerError, match=r"unknown arm 'third'"):
        wire.job_comparison_from_proto(sent)
