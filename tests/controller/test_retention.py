"""Retention on SQLite and PostgreSQL: old results go in whole batches, what rollouts and studies refer to stays.

The clock is injected: rows are written "long ago" and "lately" by moving it, and one pass is run.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from tests.controller.rollout.fleet import V1
from topo_tune.config.cluster import RetentionConfig
from topo_tune.controller.commands import CommandBook
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import (
    BenchmarkJobRow,
    CommandRow,
    ConfigVersionRow,
    DriftCheckRow,
    EventRow,
    GateResultRow,
    JobComparisonRow,
    JobTimingRow,
    NodeRow,
    RolloutRow,
    StudyRow,
)
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.retention import Retention, RetentionReport
from topo_tune.controller.rollout.verification import gate_job_id
from topo_tune.nccl.backends import Backend
from topo_tune.v1 import agent_pb2

NOW = datetime(2026, 6, 1, tzinfo=UTC)
LONG_AGO = NOW - timedelta(days=120)
LATELY = NOW - timedelta(days=10)
NODES = ("n1", "n2", "n3")


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url, retry_for_s=5)
    database.migrate()

    def nodes(session: Session) -> None:
        session.add_all(
            NodeRow(name=n, state="ready", registered_at=LONG_AGO, last_heartbeat_at=NOW, state_changed_at=NOW)
            for n in NODES
        )

    database.transact(nodes)
    yield database
    database.close()


def job(
    session: Session, job_id: str, *, at: datetime, nodes: tuple[str, ...] = ("n1", "n2"), status: str = "succeeded"
) -> None:
    """A benchmark job as the job book stores it: the job row and one command per node."""
    session.add(
        BenchmarkJobRow(
            id=job_id, status=status, backend=Backend.SIM, nodes=list(nodes), spec={}, created_at=at, deadline_at=at
        )
    )
    session.add_all(
        CommandRow(
            id=f"{job_id}-{i}",
            node_name=node,
            kind="run_benchmark",
            job_id=job_id,
            body=b"",
            status="succeeded" if status != "running" else "sent",
            result=b"result",
            created_at=at,
        )
        for i, node in enumerate(nodes)
    )


def remaining(db: Database) -> tuple[set[str], set[str]]:
    def read(session: Session) -> tuple[set[str], set[str]]:
        return set(session.scalars(sa.select(BenchmarkJobRow.id))), set(session.scalars(sa.select(CommandRow.job_id)))

    return db.transact(read)


def retention(db: Database, **settings: object) -> Retention:
    values: dict[str, object] = {"max_age": 90 * 86400.0, "batch_size": 2}
    values.update(settings)
    return Retention(
        db=db,
        wall_clock=lambda: NOW,
        settings=RetentionConfig.model_validate(values),
        metrics=ControllerMetrics(),  # type: ignore[arg-type]
    )


async def test_old_jobs_go_with_their_commands_in_batches_and_young_or_running_ones_stay(db: Database) -> None:
    def write(session: Session) -> None:
        for i in range(5):
            job(session, f"old-{i}", at=LONG_AGO + timedelta(minutes=i))
        job(session, "old-running", at=LONG_AGO, status="running")
        job(session, "young", at=LATELY)

    db.transact(write)
    keeper = retention(db)
    report = await keeper.run()
    assert report == RetentionReport(benchmark_jobs=5, commands=10, events=0, drift_checks=0)
    jobs, commands = remaining(db)
    assert jobs == commands == {"old-running", "young"}, "no job left without its commands, nor the reverse"
    assert keeper.metrics is not None
    assert keeper.metrics.registry.get_sample_value("topo_tune_retention_deleted_total", {"kind": "commands"}) == 10
    assert await keeper.run() == RetentionReport(), "a second pass finds nothing"


async def test_jobs_behind_gate_samples_chosen_studies_and_kept_drift_checks_stay(db: Database) -> None:
    gate_new = gate_job_id("ro-1", wave=0, attempt=1, repeat=0, arm="new")
    gate_previous = gate_job_id("ro-1", wave=0, attempt=1, repeat=0, arm="previous")
    gate_unpaired = gate_job_id("ro-1", wave=0, attempt=1, repeat=1, arm="new")  # its repeat gave no pair
    study_start = LONG_AGO - timedelta(days=10)  # the other old jobs ran after the studies

    def write(session: Session) -> None:
        session.add(ConfigVersionRow(id=V1.id, files=dict(V1.files), provenance={}, created_at=LONG_AGO))
        session.add(
            RolloutRow(
                id="ro-1",
                config_version=V1.id,
                phase="completed",
                policy={},
                thresholds={},
                created_at=LONG_AGO,
                updated_at=LONG_AGO,
            )
        )
        session.flush()
        sample = {"time_us": 1.0, "p99_us": 1.0, "busbw_gbps": 40.0}
        session.add(
            GateResultRow(
                rollout_id="ro-1",
                wave=0,
                attempt=1,
                outcome="successful",
                verdict={},
                samples=[{"repeat": 0, "arm": "new", **sample}, {"repeat": 0, "arm": "previous", **sample}],
                measured_at=LONG_AGO,
            )
        )
        for job_id in (gate_new, gate_previous, gate_unpaired):
            job(session, job_id, at=LONG_AGO)
        for status, result in (("succeeded", "promoted"), ("succeeded", "keep NCCL's defaults")):
            session.add(
                StudyRow(
                    id=f"st-{result[:4]}",
                    status=status,
                    request={},
                    nodes=["n1", "n2"] if result == "promoted" else ["n3"],
                    result=result,
                    created_at=study_start,
                    finished_at=study_start + timedelta(hours=3),
                )
            )
        job(session, "chosen-study-trial", at=study_start + timedelta(hours=1), nodes=("n2", "n1"))
        job(session, "defaults-study-trial", at=study_start + timedelta(hours=1), nodes=("n3",))
        job(session, "after-the-study", at=study_start + timedelta(hours=4), nodes=("n1",))
        session.add(
            DriftCheckRow(
                id="dc-old", kind="benchmark", status="ok", nodes=["n1"], job_ids=["dc-old-0"], created_at=LONG_AGO
            )
        )
        session.add(
            DriftCheckRow(
                id="dc-new", kind="benchmark", status="ok", nodes=["n1"], job_ids=["dc-old-1"], created_at=LATELY
            )
        )
        job(session, "dc-old-0", at=LONG_AGO, nodes=("n1",))
        job(session, "dc-old-1", at=LONG_AGO, nodes=("n1",))  # an old job a kept drift check refers to

    db.transact(write)
    report = await retention(db).run()
    jobs, commands = remaining(db)
    assert jobs == commands == {gate_new, gate_previous, "chosen-study-trial", "dc-old-1"}
    assert report.benchmark_jobs == 4 and report.drift_checks == 1

    def drift_ids(session: Session) -> set[str]:
        return set(session.scalars(sa.select(DriftCheckRow.id)))

    assert db.transact(drift_ids) == {"dc-new"}


async def test_old_events_go_and_a_misbehaving_agent_keeps_only_its_newest_ignored_results(db: Database) -> None:
    at = iter(LONG_AGO + timedelta(seconds=i) for i in range(1000))
    commands = CommandBook(db=db, wall_clock=lambda: next(at), ignored_results_kept=3)
    for i in range(10):
        result = agent_pb2.CommandResult(command_id=f"made-up-{i}", status=agent_pb2.COMMAND_STATUS_SUCCEEDED)
        assert not (await commands.finish("n1", result)).known
    await commands.finish("n2", agent_pb2.CommandResult(command_id="other", status=agent_pb2.COMMAND_STATUS_SUCCEEDED))

    def ignored(session: Session) -> list[tuple[str, str]]:
        rows = session.execute(
            sa.select(EventRow.node_name, EventRow.command_id)
            .where(EventRow.kind == "result.ignored")
            .order_by(EventRow.id)
        )
        return [(r[0], r[1]) for r in rows]

    assert db.transact(ignored) == [("n1", "made-up-7"), ("n1", "made-up-8"), ("n1", "made-up-9"), ("n2", "other")]

    db.transact(lambda session: session.add(EventRow(node_name="n3", kind="node.lost", at=LATELY)))
    report = await retention(db).run()
    assert report.events == 4

    def kinds(session: Session) -> list[str]:
        return list(session.scalars(sa.select(EventRow.kind)))

    assert db.transact(kinds) == ["node.lost"]


async def test_retention_turned_off_keeps_everything(db: Database) -> None:
    db.transact(lambda session: job(session, "ancient", at=LONG_AGO - timedelta(days=3000)))
    assert await retention(db, enabled=False).run() == RetentionReport()
    assert remaining(db)[0] == {"ancient"}


async def test_job_comparisons_older_than_their_own_max_age_go(db: Database) -> None:
    def write(session: Session) -> None:
        for key, at in (("jc-old-1", LATELY - timedelta(days=25)), ("jc-old-2", LONG_AGO), ("jc-young", LATELY)):
            session.add(JobComparisonRow(id=key, job_id=key, owner="", header={}, runs=[], figures=None, created_at=at))

    db.transact(write)
    # Beyond 30 days (the comparisons' own age, not the 90 of benchmark results): what a job credential
    # recorded lately stays, what it recorded before goes and frees its cap (tenancy).
    report = await retention(db, job_comparison_max_age=30 * 86400.0).run()
    assert report == RetentionReport(job_comparisons=2)
    assert db.transact(lambda s: set(s.scalars(sa.select(JobComparisonRow.id)))) == {"jc-young"}


def timings(db: Database) -> dict[str, int]:
    """Records held per job."""
    query = sa.select(JobTimingRow.job_id, sa.func.count()).group_by(JobTimingRow.job_id)
    return db.transact(lambda session: {job_id: n for job_id, n in session.execute(query)})


async def test_timing_records_go_a_whole_job_at_a_time_by_age_then_beyond_the_cap(db: Database) -> None:
    def write(session: Session) -> None:
        jobs = {"old": [LONG_AGO] * 3, "straddling": [LONG_AGO, LATELY], "young-1": [LATELY - timedelta(days=2)]}
        jobs |= {"young-2": [LATELY - timedelta(days=1)] * 2, "young-3": [LATELY]}
        for job_id, times in jobs.items():
            session.add_all(
                JobTimingRow(
                    job_id=job_id,
                    comm="abc",
                    rank=rank,
                    config_version="cv-0000000000000001",
                    arm=0,
                    node="n1",
                    record="(a record)",
                    owner="",
                    created_at=at,
                )
                for rank, at in enumerate(times)
            )

    db.transact(write)
    # The old job is larger than a batch (2): it still goes whole, in one transaction. The straddling job's
    # newest record is young, so its old one stays: a job is never left missing a rank's record.
    assert (await retention(db).run()).job_timings == 3
    assert timings(db) == {"straddling": 2, "young-1": 1, "young-2": 2, "young-3": 1}
    # Beyond the cap (3 records), the oldest jobs (by their newest record) go, whole, until at most 3 are held.
    report = await retention(db, job_timing_max_records=3).run()
    assert report == RetentionReport(job_timings=3)
    assert timings(db) == {"straddling": 2, "young-3": 1}
    assert await retention(db, job_timing_max_records=3).run() == RetentionReport(), "nothing beyond the cap"
