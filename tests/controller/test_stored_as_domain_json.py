"""Upgrading a database that stored admin API messages (a finished job's ``BenchmarkJob``, a study's
``StartStudyRequest``): what they said survives into the domain JSON and reads back through the services, and a
downgrade restores the old messages."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from importlib import resources

import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig

from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.job_record import JobStatus
from topo_tune.benchmark.results import NcclChoice
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, plan_job
from topo_tune.controller.benchmarks.service import BenchmarkJobs
from topo_tune.controller.commands import CommandBook
from topo_tune.controller.db.database import Database
from topo_tune.controller.nodes import NodeRegistry
from topo_tune.nccl.collectives import Collective
from topo_tune.study_record import StudyRequest
from topo_tune.v1 import admin_pb2, agent_pb2
from topo_tune.wire.benchmark import spec_to_proto

AT = datetime(2026, 1, 1, tzinfo=UTC)
ROWS = [
    agent_pb2.SizeResult(
        bytes=1024, count=256, time_us=12.5, algbw_gbps=0.08, busbw_gbps=0.1, p50_us=12.0, p99_us=14.0, cv=0.02,
        checked=True,
        choice=agent_pb2.NcclChoice(offered=["ring/ll", "tree/ll"], nccl="ring/ll", applied="tree/ll", channels=2),
    ),
    agent_pb2.SizeResult(bytes=8192, count=2048, time_us=20.0, busbw_gbps=0.6, in_place=True, wrong=3),
]  # fmt: skip


def _config(database: Database) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(resources.files("topo_tune.controller.db") / "migrations"))
    config.attributes["connection_url"] = database.url
    return config


def _old_job(run: agent_pb2.RunBenchmark) -> admin_pb2.BenchmarkJob:
    job = admin_pb2.BenchmarkJob(
        job_id="bj-old",
        status=admin_pb2.BENCHMARK_JOB_STATUS_FAILED,
        message="job bj-old failed: b: wrong elements",
        collective=run.collective,
        nodes=["a", "b"],
        world_size=2,
        dtype="float32",
        sizes=ROWS,
        missing_ranks=[1],
        hung_ranks=[1],
        simulated=True,
        backend=agent_pb2.BACKEND_SIM,
        sizes_requested=run.sizes,
        iters=5,
        warmup_iters=1,
    )
    job.env.update(run.env)
    job.created_at.FromDatetime(AT)
    job.finished_at.FromDatetime(AT)
    return job


async def test_a_finished_job_stored_as_a_message_reads_back_after_the_upgrade(database_url: str) -> None:
    database = Database(database_url, retry_for_s=5)
    config = _config(database)
    spec = plan_job(
        job_id="bj-old",
        collective=Collective.ALL_REDUCE,
        sweep=SizeSweep(1024, 8192, 8),
        dtype=dtype_named("float32"),
        nodes=[JobNode("a", "10.0.0.1", 1), JobNode("b", "10.0.0.2", 1)],
        rendezvous_port=20001,
        env={"NCCL_ALGO": "ring"},
        gpu_devices=False,
        warmup_iters=1,
        iters=5,
        placements=(False, True),
    )
    run = spec_to_proto(spec)
    old = _old_job(run)
    values = {"status": "failed", "message": old.message, "backend": "sim", "nodes": ["a", "b"]}
    try:
        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.upgrade(config, "0009")
            table = sa.Table("benchmark_jobs", sa.MetaData(), autoload_with=connection)
            connection.execute(
                sa.insert(table).values(
                    id="bj-old",
                    **values,
                    spec=run.SerializeToString(),
                    result=old.SerializeToString(),
                    created_at=AT,
                    deadline_at=AT,
                    finished_at=AT,
                )
            )
        database.migrate()
        registry = NodeRegistry(db=database, expiry_s=30, clock=lambda: 0.0, wall_clock=lambda: AT)
        jobs = BenchmarkJobs(
            db=database,
            registry=registry,
            commands=CommandBook(db=database, wall_clock=lambda: AT),
            deliver=lambda record: _never(),
            wall_clock=lambda: AT,
        )
        job = await jobs.get("bj-old")
        assert (job.status, job.message, job.collective) == (JobStatus.FAILED, old.message, Collective.ALL_REDUCE)
        assert [(s.bytes, s.time_us, s.in_place, s.wrong, s.p99_us) for s in job.sizes] == [
            (1024, 12.5, False, 0, 14.0),
            (8192, 20.0, True, 3, 0.0),
        ]
        assert job.sizes[0].choice == NcclChoice(("ring/ll", "tree/ll"), "ring/ll", "tree/ll", 2)
        assert job.sizes[1].choice is None
        assert (job.env, job.iters, job.world_size, job.dtype) == ({"NCCL_ALGO": "ring"}, 5, 2, "float32")
        assert (job.missing_ranks, job.hung_ranks, job.simulated, job.finished_at) == ((1,), (1,), True, AT)

        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.downgrade(config, "0009")
            stored = connection.execute(sa.text("SELECT result FROM benchmark_jobs WHERE id = 'bj-old'")).scalar_one()
        assert admin_pb2.BenchmarkJob.FromString(stored) == old, "the downgrade restores the old message"
    finally:
        database.close()


async def _never() -> bool:
    return False


def test_a_study_request_stored_as_a_message_reads_back_after_the_upgrade(database_url: str) -> None:
    database = Database(database_url, retry_for_s=5)
    config = _config(database)
    old = admin_pb2.StartStudyRequest(
        study_id="st-old",
        nodes=["a", "b"],
        collectives={"all_reduce": 0.75, "all_gather": 0.25},
        budget=12,
        sampler="random",
        seed=7,
        min_bytes=1024,
        site_fixed={"NCCL_IB_HCA": "mlx5"},
        knobs=["NCCL_ALGO"],
        cuda_graph=False,
    )
    try:
        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.upgrade(config, "0010")
            table = sa.Table("tuning_studies", sa.MetaData(), autoload_with=connection)
            connection.execute(
                sa.insert(table).values(
                    id="st-old",
                    status="cancelled",
                    message="",
                    request=old.SerializeToString(deterministic=True),
                    nodes=["a", "b"],
                    optuna_name="",
                    result="",
                    config_version="",
                    simulated=True,
                    created_at=AT,
                )
            )
        database.migrate()
        with database.engine.connect() as connection:
            stored = connection.execute(sa.text("SELECT request FROM tuning_studies")).scalar_one()
        stored = stored if isinstance(stored, dict) else json.loads(stored)
        assert StudyRequest.from_json(stored) == StudyRequest(
            study_id="st-old",
            nodes=("a", "b"),
            collectives={"all_reduce": 0.75, "all_gather": 0.25},
            budget=12,
            sampler="random",
            seed=7,
            min_bytes=1024,
            site_fixed={"NCCL_IB_HCA": "mlx5"},
            knobs=("NCCL_ALGO",),
            cuda_graph=False,
        ), "the same settings: starting the study again resumes it"

        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.downgrade(config, "0010")
            back = connection.execute(sa.text("SELECT request FROM tuning_studies")).scalar_one()
        assert admin_pb2.StartStudyRequest.FromString(back) == old
    finally:
        database.close()
