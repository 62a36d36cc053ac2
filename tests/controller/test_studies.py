"""Studies run by the controller: start, watch, list trials, cancel, resume with every trial counted once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import grpc
import optuna
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from tests.conftest import controller_settings
from tests.controller.test_benchmark_jobs_service import RunningAgent, agents, registered  # noqa: F401
from tests.support.processes import TOKEN
from tests.support.waiting import async_wait_until
from tests.test_cli_watch import Calls
from topo_tune.cli.main import cli
from topo_tune.cli.study_pass import InitPass
from topo_tune.config.cluster import ClusterConfig, LearningConfig, SearchConfig, WorkloadConfig
from topo_tune.controller.db.models import StudyRow
from topo_tune.controller.server import Controller
from topo_tune.controller.studies import StudyEnd
from topo_tune.errors import DatabaseFull, NotFoundError, StudyError, ValidationError
from topo_tune.study_record import Study, StudyRequest, StudyStatus
from topo_tune.v1 import admin_pb2
from topo_tune.wire.studies import from_proto_study_request

T = TypeVar("T")

pytestmark = pytest.mark.slow


class RememberingPass:
    """The real pass of ``init``, remembering the cluster each study handed it."""

    def __init__(self) -> None:
        self.clusters: list[ClusterConfig] = []

    def run(self, cluster: ClusterConfig, port: Any, **given: Any) -> StudyEnd:
        self.clusters.append(cluster)
        return InitPass().run(cluster, port, **given)


@pytest.fixture
async def jobs_controller(sqlite_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Controller]:
    """A controller running studies; parametrized indirectly, its cluster.yaml ``learning`` section."""
    server = Controller(
        controller_settings(
            sqlite_url,
            heartbeat_expiry_s=30,
            studies_dir=tmp_path / "studies",
            rack_of={"s1": "rack-a", "s2": "rack-b", "s3": "rack-a", "s4": "rack-b"},
            learning=getattr(request, "param", LearningConfig()),
        ),
        study_pass=RememberingPass(),
    )
    await server.start()
    yield server
    await server.stop()


def study_request(**fields: object) -> StudyRequest:
    values: dict[str, object] = {
        "collectives": {"all_gather": 1.0},
        "budget": 8,
        "min_bytes": 1 << 20,
        "max_bytes": 1 << 28,
        "step_factor": 16,
        "finalists": 1,
        "proof_pairs": 2,
    }
    values.update(fields)
    return from_proto_study_request(admin_pb2.StartStudyRequest(**values))  # type: ignore[arg-type]


async def ended(controller: Controller, study_id: str) -> Study:
    async def done() -> Study | None:
        info = await controller.studies.get(study_id)
        return info if info.status != StudyStatus.RUNNING else None

    return await async_wait_until(done, timeout=240, what=f"study {study_id}")


async def test_a_study_runs_on_known_nodes_and_stores_its_version(
    jobs_controller: Controller,
    agents: Callable[..., RunningAgent],  # noqa: F811
) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2", "s3", "s4")))
    info = await jobs_controller.studies.start(study_request(study_id="st-first"))
    assert info.status == StudyStatus.RUNNING
    done = await ended(jobs_controller, "st-first")
    assert done.status == StudyStatus.SUCCEEDED, done.message
    assert done.simulated and done.result in ("promoted", "keep NCCL's defaults")
    assert (await jobs_controller.config_versions.get(done.config_version)).id == done.config_version
    trials = await jobs_controller.studies.trials("st-first")
    assert len([t for t in trials.trials if t.state == "complete"]) >= 1
    assert (Path(jobs_controller.settings.studies_dir) / "st-first" / "summary.json").is_file()

    address = f"127.0.0.1:{jobs_controller.port}"
    shown = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "study", "best", "st-first", "--controller", address],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert shown.exit_code == 0 and "best trial" in shown.stdout
    with pytest.raises(NotFoundError):
        await jobs_controller.studies.get("st-nothing")
    with pytest.raises(NotFoundError, match="ghost"):
        await jobs_controller.studies.start(study_request(nodes=["s1", "ghost"]))
    with pytest.raises(ValidationError, match="study_id"):
        await jobs_controller.studies.start(study_request(study_id="bad id!"))
    refused = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "study", "start", "--cuda-graph", "--controller", address],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert refused.exit_code != 0
    assert "error: --cuda-graph: CUDA graphs need backend nccl, not sim" in refused.output


async def test_study_start_wait_follows_the_stream_to_the_end_and_a_short_study_gets_no_timeout_advice(
    jobs_controller: Controller,
    agents: Callable[..., RunningAgent],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    calls = Calls()  # every RPC the CLI starts, and every message its stream delivers
    plain = grpc.insecure_channel
    monkeypatch.setattr(grpc, "insecure_channel", lambda *a, **k: grpc.intercept_channel(plain(*a, **k), calls))
    args = ["admin", "study", "start", "--id", "st-short", "--nodes", "s1,s2", "--collective", "all_gather"]
    args += ["--budget", "1", "--min-bytes", str(1 << 20), "--max-bytes", str(1 << 24), "--proof-pairs", "2"]
    args += ["--finalists", "1", "--wait", "--controller", f"127.0.0.1:{jobs_controller.port}"]
    waited = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    returned_at = time.time()
    assert waited.exit_code == 0, waited.output
    assert "succeeded (SIMULATED)" in waited.stdout, "it printed the ended study"
    # One call to start, one stream to wait: no call at all (no GetStudy) while the study ran.
    assert [method for method, _ in calls.started] == ["StartStudy", "WatchStudy"]
    assert len(calls.streamed) >= 3, "the state at its start, each trial or phase on the way, the end"
    done = await jobs_controller.studies.get("st-short")
    assert done.status == StudyStatus.SUCCEEDED, done.message
    assert done.finished_at is not None and done.finished_at.timestamp() <= returned_at, "it returned at the end"
    summary = json.loads((Path(jobs_controller.settings.studies_dir) / "st-short" / "summary.json").read_text())
    assert not summary.get("timeout_advice"), "fewer than five measurements fit no latency"


async def test_study_start_wait_exits_1_when_the_study_does_not_succeed(
    jobs_controller: Controller,
    agents: Callable[..., RunningAgent],  # noqa: F811
) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    args = ["admin", "study", "start", "--id", "st-stopped", "--budget", "40", "--wait"]
    waiting = asyncio.create_task(
        asyncio.to_thread(
            CliRunner().invoke,
            cli,
            [*args, "--controller", f"127.0.0.1:{jobs_controller.port}"],
            env={"TOPO_TUNE_TOKEN": TOKEN},
        )
    )

    async def started() -> bool:
        try:
            return (await jobs_controller.studies.get("st-stopped")).status == StudyStatus.RUNNING
        except NotFoundError:
            return False

    await async_wait_until(started, timeout=30, what="the study to start")
    await jobs_controller.studies.cancel("st-stopped")
    waited = await asyncio.wait_for(waiting, 60)
    assert waited.exit_code == 1, waited.output
    assert waited.stderr.strip().splitlines()[-1] == (  # before it: this process's controller's log lines
        "topo-tune: error: study st-stopped cancelled: cancelled by an admin; start it again with this id to resume"
    )


async def test_cancel_then_resume_counts_every_trial_once(
    jobs_controller: Controller,
    agents: Callable[..., RunningAgent],  # noqa: F811
) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    # No per-size table search: its option trials (one per entry NCCL offers) would blur the count.
    request = study_request(study_id="st-resume", budget=14, no_tuner_table=True)
    await jobs_controller.studies.start(request)

    async def some_trials() -> bool:
        info = await jobs_controller.studies.get("st-resume")
        assert info.status == StudyStatus.RUNNING, info.message
        return len((await jobs_controller.studies.trials("st-resume")).trials) >= 3

    await async_wait_until(some_trials, timeout=120, what="three trials")
    cancelled = await jobs_controller.studies.cancel("st-resume")
    assert cancelled.status == StudyStatus.CANCELLED
    await jobs_controller.studies.start(request)
    done = await ended(jobs_controller, "st-resume")
    assert done.status == StudyStatus.SUCCEEDED, done.message
    trials = (await jobs_controller.studies.trials("st-resume")).trials
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers))
    finished = [t for t in trials if t.state in ("complete", "pruned")]
    # 14 of the budget and one retry of the trial the cancel interrupted.
    assert 14 <= len(trials) <= 15 and len(finished) >= 13, [(t.number, t.state) for t in trials]


async def test_a_study_on_nccl_nodes_is_graph_timed_unless_asked_eager(
    jobs_controller: Controller,
    agents: Callable[..., RunningAgent],  # noqa: F811
) -> None:
    await registered(*(agents(name, "nccl") for name in ("s1", "s2")))
    await registered(agents("s3", "gloo"))
    nccl = ["s1", "s2"]
    studies = jobs_controller.studies
    assert (await studies._cluster("st-g", study_request(nodes=nccl))).search.cuda_graph
    assert not (await studies._cluster("st-e", study_request(nodes=nccl, cuda_graph=False))).search.cuda_graph
    assert not (await studies._cluster("st-c", study_request(nodes=["s3"]))).search.cuda_graph, "gloo stays eager"
    bare = await studies._cluster("st-d", StudyRequest(nodes=tuple(nccl)))
    assert bare.search == SearchConfig(cuda_graph=True), "an empty request gets cluster.yaml's search defaults"
    assert bare.workload == WorkloadConfig() and [n.name for r in bare.racks for n in r.nodes] == nccl
    with pytest.raises(ValidationError, match=r"^search\.proof_pairs: input should be greater than or equal to 2$"):
        await studies._cluster("st-b", study_request(nodes=nccl, proof_pairs=1))


async def test_a_study_whose_database_disk_fills_up_stops_at_once_saying_so(
    jobs_controller: Controller,
    agents: Callable[..., RunningAgent],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))

    def full(*_args: object, **_kwargs: object) -> None:
        # What Optuna's storage raises when a trial cannot be written: its own error, the driver's inside.
        driver = sqlite3.OperationalError("database or disk is full")
        try:
            raise sa.exc.OperationalError("INSERT INTO trials", {}, driver)
        except sa.exc.OperationalError as error:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from error

    monkeypatch.setattr(jobs_controller.studies, "study_pass", SimpleNamespace(run=full))
    started = time.monotonic()
    await jobs_controller.studies.start(study_request(study_id="st-full"))
    done = await ended(jobs_controller, "st-full")
    assert time.monotonic() - started < 10, "a full disk is not waited for as an outage is"
    assert done.status == StudyStatus.FAILED
    assert done.message.startswith("the disk under the database filled up mid-study (OperationalError: "), done.message
    assert "database or disk is full" in done.message and "free space" in done.message, done.message


async def test_a_study_whose_end_cannot_be_stored_is_answered_as_ended_and_a_start_writes_it_again(
    jobs_controller: Controller,
    agents: Callable[..., RunningAgent],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk stays full after the study stopped: its row cannot leave "running". Watchers and ``status``
    still learn that it ended and why; once space is freed, a start with the id resumes (and is stored)."""
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    studies, disk_full = jobs_controller.studies, threading.Event()
    store = studies.db.transact

    def transact(work: Callable[[Any], T]) -> T:
        if disk_full.is_set():
            raise DatabaseFull("database controller is full: no space left on the disk under it")
        return store(work)

    runs: list[int] = []

    def stopped(*_args: object, **_kwargs: object) -> None:
        runs.append(1)
        if len(runs) == 1:  # the first run's end meets a full disk
            disk_full.set()
        raise StudyError("a trial could not be written")

    monkeypatch.setattr(studies.db, "transact", transact)
    monkeypatch.setattr(studies, "study_pass", SimpleNamespace(run=stopped))
    await studies.start(study_request(study_id="st-unstored"))
    done = await ended(jobs_controller, "st-unstored")
    assert done.status == StudyStatus.FAILED and done.finished_at is not None
    assert done.message == (
        "a trial could not be written; the controller could not store this end (database controller is full: "
        "no space left on the disk under it)"
    )
    row = await studies.db.read(lambda session: session.get(StudyRow, "st-unstored"))
    assert row is not None and row.status == "running", "the row itself could not be written"

    disk_full.clear()  # space freed: the same id starts again, and its end is stored this time
    await studies.start(study_request(study_id="st-unstored"))
    assert (await ended(jobs_controller, "st-unstored")).message == "a trial could not be written"
    row = await studies.db.read(lambda session: session.get(StudyRow, "st-unstored"))
    assert row is not None and row.status == "failed" and row.message == "a trial could not be written"


LEARNING_ON = LearningConfig(enabled=True, explore_share=0.2, timing_sample=8)


@pytest.mark.parametrize("jobs_controller", [LEARNING_ON], indirect=True)
async def test_a_study_at_a_controller_with_learning_on_runs_the_pass_with_it_as_init_does(
    jobs_controller: Controller,
    agents: Callable[..., RunningAgent],  # noqa: F811
) -> None:
    """The pass carries challengers when its cluster's learning is on (``tests/learning/test_carried.py``);
    a study builds that cluster from the request and the controller's cluster.yaml, which must bring it."""
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    await jobs_controller.studies.start(study_request(study_id="st-learning"))
    done = await ended(jobs_controller, "st-learning")
    assert done.status == StudyStatus.SUCCEEDED, done.message
    remembering = jobs_controller.studies.study_pass
    assert isinstance(remembering, RememberingPass)
    assert [c.learning for c in remembering.clusters] == [LEARNING_ON], "cluster.yaml's learning section, as init's"
