"""Jobs' own A/B comparisons at a real controller: recorded run by run with a job credential, figures computed
by the controller once every run is in, listed by admins (``admin job comparisons``)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session

from tests.support.processes import TOKEN
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.db.models import JobComparisonRow
from topo_tune.controller.server import Controller
from topo_tune.errors import AlreadyExists, ConflictError, PermissionDenied, ValidationError
from topo_tune.jobs.compare.comparison_record import ComparisonHeader, StoredComparison
from topo_tune.jobs.compare.schedule import Arm, arm_schedule
from topo_tune.jobs.compare.summary import RunValue
from topo_tune.security.auth import bearer_metadata
from topo_tune.tuner.report.job_comparisons import comparison_section
from topo_tune.tuner.statistics import Decision
from topo_tune.v1 import admin_pb2
from topo_tune.versions.version import ConfigVersion

JOB = "train-77"
PAIRS = 3
VALUES = {Arm.CANDIDATE: [1.0, 1.02, 0.98], Arm.AGAINST: [2.0, 2.04, 1.97]}
# The arms' orders put a different node first: the candidate's runs are read on n2, the others' on n1.
CANDIDATE_ORDER = ["n2", "n1"]
AGAINST_ORDER = ["n1", "n2"]
VERSION = ConfigVersion(
    {
        "nccl.conf": "NCCL_MIN_NCHANNELS=4\n",
        "rankmap.json": json.dumps({"version": 1, "planned": {"node_order": CANDIDATE_ORDER}}),
    },
    {"study": "compare-test"},
)


def _pin_arms(controller: Controller, job_id: str = JOB) -> None:
    """What exec --compare does first on every node: the controller pins each arm's version and order."""
    with AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as admin:
        admin.put_config_version(dict(VERSION.files), dict(VERSION.provenance))
    with _job_client(controller) as client:
        for arm in (VERSION.id, "defaults"):
            client.resolve_job_config(job_id, ["n1", "n2"], arm=arm)


Record = tuple[ComparisonHeader, list[RunValue]]
"""What one node records: the header every node sends alike, and the runs it read."""


def _request(arm: Arm | None, *, runs: list[RunValue] | None = None, **changes: Any) -> Record:
    """The record of the node that read ``arm``'s runs (None: every run), with ``changes`` to the header."""
    if runs is None:
        runs = []
        for run in arm_schedule(JOB, PAIRS):
            if arm is None or run.arm is arm:
                node = (CANDIDATE_ORDER if run.arm is Arm.CANDIDATE else AGAINST_ORDER)[0]
                runs.append(RunValue(run.index, run.pair, run.arm, VALUES[run.arm][run.pair], node))
    header = ComparisonHeader(
        job_id=JOB,
        candidate=VERSION.id,
        candidate_version=VERSION.id,
        against="defaults",
        against_version="",
        metric=r"step_time=([0-9.]+)",
        higher_is_better=False,
        pairs=PAIRS,
        nodes=("n1", "n2"),
        candidate_order=tuple(CANDIDATE_ORDER),
        against_order=tuple(AGAINST_ORDER),
    )
    return dataclasses.replace(header, **changes), runs


JOB_TOKEN = Credentials(TOKEN).issue_job()
"""One tenant's job credential: what it pins, it records."""


def _job_client(controller: Controller) -> AdminClient:
    return AdminClient(f"127.0.0.1:{controller.port}", token=JOB_TOKEN)


async def test_two_nodes_records_make_one_comparison_with_the_proofs_figures(
    controller: Controller, tmp_path: Path
) -> None:
    def record() -> tuple[StoredComparison, StoredComparison, StoredComparison]:
        _pin_arms(controller)
        with _job_client(controller) as client:
            first = client.record_job_comparison(*_request(Arm.AGAINST))
            again = client.record_job_comparison(*_request(Arm.AGAINST))  # a retry: a no-op
            last = client.record_job_comparison(*_request(Arm.CANDIDATE))
        return first, again, last

    first, again, last = await asyncio.to_thread(record)
    assert not first.complete and len(first.runs) == PAIRS and first.figures is None
    assert not again.complete and again.id == first.id
    assert last.complete and len(last.runs) == 2 * PAIRS
    assert [r.index for r in last.runs] == list(range(2 * PAIRS))
    figures = last.figures
    assert figures is not None and 1.9 < figures.gain < 2.1 and figures.ci_low < figures.gain < figures.ci_high
    assert figures.decision is Decision.FASTER and figures.confidence == pytest.approx(0.98)
    assert (figures.candidate_median, figures.against_median) == (1.0, 2.0)

    result = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "job", "comparisons", "--controller", f"127.0.0.1:{controller.port}"],
        env={"TOPO_TUNE_TOKEN": TOKEN, "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert JOB in result.output and VERSION.id in result.output and "faster" in result.output
    listed = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "job", "comparisons", "--job-id", JOB, "-o", "json", "--controller", f"127.0.0.1:{controller.port}"],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    (data,) = json.loads(listed.stdout)
    assert data["complete"] and data["job"]["runs"][0]["node"] in ("n1", "n2")

    report = tmp_path / "report.html"
    report.write_text(f"<html><h1>init's page</h1>{comparison_section([])}</html>")
    refreshed = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "job", "comparisons", "--report", str(report), "--controller", f"127.0.0.1:{controller.port}"],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert refreshed.exit_code == 0, refreshed.output
    page = report.read_text()
    assert page.startswith("<html><h1>init's page</h1>") and JOB in page and "No job has compared" not in page


async def test_records_that_disagree_with_the_schedule_or_each_other_are_refused(controller: Controller) -> None:
    def refusals() -> list[str]:
        seen = []
        with _job_client(controller) as client:
            with pytest.raises(ConflictError, match=f"job {JOB} has no pinned config for arm {VERSION.id}"):
                client.record_job_comparison(*_request(Arm.AGAINST))
            _pin_arms(controller)
            client.record_job_comparison(*_request(Arm.AGAINST))
            _, bad_runs = _request(Arm.CANDIDATE)
            wrong_arm = dataclasses.replace(bad_runs[0], arm=Arm.AGAINST)
            changed = dataclasses.replace(_request(Arm.AGAINST)[1][0], value=9.0)
            wrong_node = dataclasses.replace(bad_runs[0], node="n1")
            for request, kind in (
                (_request(None, runs=[wrong_arm]), ValidationError),
                (_request(None, runs=[wrong_node]), ValidationError),
                (_request(None, runs=[changed]), AlreadyExists),
                (_request(Arm.CANDIDATE, metric="other=([0-9]+)"), ConflictError),
                (_request(Arm.CANDIDATE, pairs=1), ValidationError),
                (_request(Arm.CANDIDATE, against_order=("n1", "n3")), ValidationError),
                (_request(Arm.CANDIDATE, candidate_order=tuple(AGAINST_ORDER), runs=[]), ValidationError),
                (_request(Arm.CANDIDATE, against="stable", against_version="cv-0123456789abcdef"), ConflictError),
            ):
                with pytest.raises(kind) as caught:
                    client.record_job_comparison(*request)
                seen.append(str(caught.value))
            # A job credential records, and reads nothing back.
            with pytest.raises(PermissionDenied, match="job credentials may not call"):
                client.list_job_comparisons()
        return seen

    seen = await asyncio.to_thread(refusals)
    assert "candidate run in job train-77's schedule, not pair" in seen[0]
    assert "node rank 0 of its arm (n2)" in seen[1]
    # The stored value (2.0 from n1) and the stored metric are not echoed: only that they differ.
    assert re.fullmatch(f"run [0-9]+ of job {JOB} is recorded already, with another value", seen[2])
    assert seen[3].startswith(f"job {JOB}'s comparison was recorded with another metric:")
    assert seen[4].startswith("pairs: must be within [2,")
    assert seen[5].startswith("against_order: must hold each of the job's nodes")
    assert seen[6] == f"candidate_order: job {JOB}'s arm {VERSION.id} is pinned to another node order"
    assert "has no pinned config for arm stable" in seen[7]


async def test_listing_more_than_a_messages_worth_of_comparisons_comes_in_pages(
    controller: Controller, tmp_path: Path
) -> None:
    # 16 comparisons of 2,000 long node names each: about 6 MB, more than a client receives in one message.
    nodes = [f"node-{i:04d}-{'x' * 90}" for i in range(2_000)]
    header = {
        **{name: "" for name in ("candidate_version", "against_version")},
        "candidate": "cv-a",
        "against": "defaults",
        "metric": "step_time=([0-9.]+)",
        "higher_is_better": False,
        "pairs": 2,
        "nodes": nodes,
        "candidate_order": nodes,
        "against_order": nodes,
    }
    start = datetime(2026, 6, 1, tzinfo=UTC)

    def write(session: Session) -> None:
        for i in range(16):
            at = start + timedelta(minutes=i)
            job = f"big-{i:02d}"
            session.add(
                JobComparisonRow(id=f"jc-{i:02d}", job_id=job, header={**header, "job_id": job}, runs=[], created_at=at)
            )

    await controller.db.run(write)
    address = f"127.0.0.1:{controller.port}"
    listed = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "job", "comparisons", "--limit", "100", "-o", "json", "--controller", address],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert listed.exit_code == 0, listed.output[-500:]
    jobs = [c["job"]["job_id"] for c in json.loads(listed.stdout)]
    assert jobs == [f"big-{i:02d}" for i in reversed(range(16))], "every one, newest first, none twice"
    with AdminClient(address, token=TOKEN) as admin:
        assert len(await asyncio.to_thread(admin.list_job_comparisons, limit=5)) == 5
        page = await asyncio.to_thread(
            admin._stub.ListJobComparisons,  # one page: whole comparisons up to about a MiB
            admin_pb2.ListJobComparisonsRequest(limit=100),
            metadata=bearer_metadata(TOKEN),
        )
    assert 1 <= len(page.comparisons) < 16 and page.next_page_token and page.ByteSize() < 2 << 20
