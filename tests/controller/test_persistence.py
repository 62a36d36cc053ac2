"""Persistence on SQLite and PostgreSQL: the schema, registry transitions, the command life cycle.

The same tests run on both backends (``database_url`` is parametrised), with an injected clock so no test
sleeps for an expiry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.autogenerate import compare_metadata
from alembic.config import Config as AlembicConfig
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from topo_tune.command_record import CommandStatus
from topo_tune.controller.commands import CommandBook
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import VERSION_TABLE, Base, CommandRow, DriftCheckRow, EventRow, NodeRow
from topo_tune.controller.nodes import NodeRegistry, Registration
from topo_tune.errors import ConflictError, NotFoundError, StorageError
from topo_tune.node_record import NodeState
from topo_tune.v1 import agent_pb2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.wall = datetime(2026, 1, 1, tzinfo=UTC)

    def monotonic(self) -> float:
        return self.now

    def wall_clock(self) -> datetime:
        return self.wall + timedelta(seconds=self.now - 1000.0)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url, retry_for_s=5)
    database.migrate()
    yield database
    database.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def registry(db: Database, clock: FakeClock, **kwargs: object) -> NodeRegistry:
    return NodeRegistry(db=db, expiry_s=3.0, clock=clock.monotonic, wall_clock=clock.wall_clock, **kwargs)  # type: ignore[arg-type]


def registration(name: str, **overrides: object) -> Registration:
    values: dict[str, object] = {
        "node_name": name,
        "rack": "",
        "labels": {"zone": "a"},
        "topology": b"",
        "agent_version": "0.1.0",
        "backend": "sim",
        "instance_id": "i-1",
        "applied_config_version": "",
        "drained": False,
    }
    values.update(overrides)
    return Registration(**values)  # type: ignore[arg-type]


def test_migrations_match_the_models(db: Database) -> None:
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        diff = compare_metadata(context, Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"


def test_migrate_is_idempotent(db: Database) -> None:
    db.migrate()
    script = ScriptDirectory(str(resources.files("topo_tune.controller.db") / "migrations"))
    with db.engine.connect() as connection:
        assert (
            connection.execute(sa.text("SELECT version_num FROM topo_tune_schema_version")).scalar_one()
            == script.get_current_head()
        )


def test_one_linear_history_of_migrations() -> None:
    script = ScriptDirectory(str(resources.files("topo_tune.controller.db") / "migrations"))
    assert len(script.get_heads()) == 1, "two migrations claim the same parent: renumber one"


def test_a_database_at_0005_keeps_its_rows_through_0006(database_url: str) -> None:
    """Upgrading a controller's database: the drift table and retention's indexes arrive, nothing is lost."""
    database = Database(database_url, retry_for_s=5)
    config = AlembicConfig()
    config.set_main_option("script_location", str(resources.files("topo_tune.controller.db") / "migrations"))
    config.attributes["connection_url"] = database.url
    try:
        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.upgrade(config, "0005")
            at = datetime(2026, 1, 1, tzinfo=UTC)
            connection.execute(
                sa.insert(EventRow.__table__).values(node_name="n1", kind="node.lost", message="", command_id="", at=at)
            )
        database.migrate()
        inspector = sa.inspect(database.engine)
        assert "drift_checks" in inspector.get_table_names()
        assert "ix_events_at" in {i["name"] for i in inspector.get_indexes("events")}
        assert "ix_benchmark_jobs_created_at" in {i["name"] for i in inspector.get_indexes("benchmark_jobs")}
        with database.engine.connect() as connection:
            assert connection.execute(sa.select(EventRow.kind)).scalars().all() == ["node.lost"]
    finally:
        database.close()


def test_a_drift_check_stored_at_0006_reads_back_through_0007(database_url: str) -> None:
    """Checks judged before the test was stored keep their figures; their p-value is simply unknown."""
    database = Database(database_url, retry_for_s=5)
    config = AlembicConfig()
    config.set_main_option("script_location", str(resources.files("topo_tune.controller.db") / "migrations"))
    config.attributes["connection_url"] = database.url
    at = datetime(2026, 1, 1, tzinfo=UTC)
    old = {"id": "dc-1", "kind": "benchmark", "status": "ok", "message": "m", "config_version": "cv-1"}
    try:
        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.upgrade(config, "0006")
            columns = {"rollout_id": "ro-1", "nodes": ["n1"], "job_ids": [], "study_id": "", "simulated": False}
            connection.execute(
                sa.insert(DriftCheckRow.__table__).values(**old, **columns, threshold=0.1, created_at=at)
            )
        database.migrate()
        with database.engine.connect() as connection:
            row = connection.execute(sa.select(DriftCheckRow.__table__).where(DriftCheckRow.id == "dc-1")).one()
        assert (row.status, row.threshold, row.p_value, row.alpha) == ("ok", 0.1, None, None)
    finally:
        database.close()


async def test_register_then_lost_then_ready(db: Database, clock: FakeClock) -> None:
    nodes = registry(db, clock, rack_of={"n1": "rack-a"})
    view = await nodes.register(registration("n1", rack="agent-says"))
    assert view.state is NodeState.READY
    assert view.rack == "rack-a", "cluster.yaml's rack wins over the agent's"
    assert view.registrations == 1

    clock.advance(2.0)
    assert nodes.heartbeat("n1", activity="idle", applied_config_version="") is False
    clock.advance(2.5)
    assert await nodes.sweep() == [], "a heartbeat 2.5 s ago is within the 3 s expiry"
    clock.advance(1.0)
    assert await nodes.sweep() == ["n1"]
    assert (await nodes.get("n1")).state is NodeState.LOST
    assert await nodes.sweep() == [], "a lost node is not lost twice"

    assert nodes.heartbeat("n1", activity="busy", applied_config_version="v1") is True
    await nodes.mark_ready("n1")
    await nodes.flush()
    view = await nodes.get("n1")
    assert (view.state, view.activity, view.applied_config_version) == (NodeState.READY, "busy", "v1")
    kinds = db.transact(lambda s: [e.kind for e in s.scalars(sa.select(EventRow).order_by(EventRow.id))])
    assert kinds == ["node.registered", "node.lost", "node.ready"]


async def test_reregistration_updates_one_row(db: Database, clock: FakeClock) -> None:
    nodes = registry(db, clock)
    await nodes.register(registration("n1"))
    await nodes.register(registration("n1", instance_id="i-2", labels={"zone": "b"}))
    rows = db.transact(lambda s: list(s.scalars(sa.select(NodeRow))))
    assert len(rows) == 1
    assert (rows[0].registrations, rows[0].instance_id, rows[0].labels) == (2, "i-2", {"zone": "b"})


async def test_restarted_registry_gives_every_node_a_fresh_window(db: Database, clock: FakeClock) -> None:
    await registry(db, clock).register(registration("n1"))
    clock.advance(100)
    fresh = registry(db, clock)
    assert await fresh.load() == 1
    assert await fresh.sweep() == [], "a restarted controller must not declare its whole fleet lost"
    clock.advance(3.5)
    assert await fresh.sweep() == ["n1"]


async def test_heartbeats_are_flushed_in_one_batch(db: Database, clock: FakeClock) -> None:
    nodes = registry(db, clock)
    for i in range(20):
        await nodes.register(registration(f"n{i}"))
    clock.advance(1.0)
    for i in range(20):
        nodes.heartbeat(f"n{i}", activity="idle", applied_config_version="v7")
    assert await nodes.flush() == 20
    assert await nodes.flush() == 0
    versions = db.transact(lambda s: set(s.scalars(sa.select(NodeRow.applied_config_version))))
    assert versions == {"v7"}


async def test_live_reports_follow_every_heartbeat_and_transition(db: Database, clock: FakeClock) -> None:
    nodes = registry(db, clock)
    await nodes.register(registration("n1"))
    await nodes.register(registration("n2"))
    before = nodes.live_report("n1")
    assert before is not None and nodes.live_report("ghost") is None
    assert nodes.off_version("") == [], "both run NCCL's defaults, the stable version of a new cluster"
    assert sorted(nodes.off_version("v2")) == ["n1", "n2"]
    clock.advance(1.0)
    nodes.heartbeat("n1", activity="idle", applied_config_version="v2", config_damage="bad file")
    nodes.heartbeat("n2", activity="idle", applied_config_version="v2")
    after = nodes.live_report("n1")
    assert after is not None
    assert (after.applied_config_version, after.config_damage) == ("v2", "bad file")
    assert after.last_seen_at > before.last_seen_at
    assert nodes.off_version("v2") == ["n1"], "a damaged version is no version"
    clock.advance(5.0)
    nodes.heartbeat("n2", activity="idle", applied_config_version="v1")
    await nodes.sweep()
    assert (report := nodes.live_report("n1")) is not None and report.state is NodeState.LOST
    assert nodes.off_version("v2") == ["n2"], "a lost node is not acted on"
    assert (nodes.lost(), nodes.counts()) == ({"n1"}, {NodeState.READY: 1, NodeState.LOST: 1})
    nodes.heartbeat("n1", activity="idle", applied_config_version="v2")
    await nodes.mark_ready("n1")
    assert (report := nodes.live_report("n1")) is not None and report.state is NodeState.READY
    assert (nodes.lost(), nodes.counts()) == (set(), {NodeState.READY: 2, NodeState.LOST: 0})
    await nodes.sweep()
    clock.advance(5.0)
    await nodes.sweep()
    assert nodes.lost() == {"n1", "n2"}
    restarted = registry(db, clock)
    await restarted.load()
    assert restarted.lost() == {"n1", "n2"}, "a restarted controller knows who was lost"
    await nodes.register(registration("n1"))
    assert nodes.lost() == {"n2"}, "a node that registers again is ready"


def rediscover() -> agent_pb2.Command:
    return agent_pb2.Command(rediscover=agent_pb2.Rediscover())


async def test_command_life_cycle(db: Database, clock: FakeClock) -> None:
    await registry(db, clock).register(registration("n1"))
    book = CommandBook(db=db, wall_clock=clock.wall_clock, new_id=iter(["c1", "c2"]).__next__)
    record = await book.submit("n1", rediscover())
    assert (record.id, record.status, record.deliveries) == ("c1", CommandStatus.PENDING, 0)
    assert record.body.command_id == "c1"

    await book.mark_sent(["c1"])
    await book.mark_sent(["c1"])
    assert (await book.get("c1")).deliveries == 2
    assert await book.acked("n1", "c1") is True
    assert (await book.get("c1")).status is CommandStatus.ACKED
    assert [r.id for r in await book.outstanding("n1")] == ["c1"]

    result = agent_pb2.CommandResult(command_id="c1", status=agent_pb2.COMMAND_STATUS_SUCCEEDED, message="ok")
    result.topology.hostname = "n1-rediscovered"
    first = await book.finish("n1", result)
    again = await book.finish("n1", result)
    assert (first.known, first.recorded) == (True, True)
    assert (again.known, again.recorded) == (True, False), "a re-sent result is not recorded twice"
    stored = await book.get("c1")
    assert stored.status is CommandStatus.SUCCEEDED
    assert stored.result is not None and stored.result.topology.hostname == "n1-rediscovered"
    assert await book.outstanding("n1") == []
    node = db.transact(lambda s: s.get(NodeRow, "n1"))
    assert node is not None and b"n1-rediscovered" in node.topology


async def test_results_arriving_together_are_each_recorded_once_with_their_effects(
    db: Database, clock: FakeClock
) -> None:
    nodes = registry(db, clock)
    for name in ("n1", "n2", "n3"):
        await nodes.register(registration(name))
    book = CommandBook(db=db, wall_clock=clock.wall_clock)
    now = clock.wall_clock()
    job = db.transact(lambda s: book.add(s, "n1", rediscover(), command_id="job-1-0", now=now, job_id="job-1"))
    drain = await book.submit("n2", agent_pb2.Command(drain=agent_pb2.Drain(drained=True)))
    failed = await book.submit("n3", rediscover())
    found = agent_pb2.CommandResult(command_id=job.id, status=agent_pb2.COMMAND_STATUS_SUCCEEDED)
    found.topology.hostname = "n1-found"
    drained = agent_pb2.CommandResult(command_id=drain.id, status=agent_pb2.COMMAND_STATUS_SUCCEEDED)
    broken = agent_pb2.CommandResult(command_id=failed.id, status=agent_pb2.COMMAND_STATUS_FAILED, message="no")
    broken.topology.hostname = "n3-not-applied"
    acks = await asyncio.gather(book.acked("n1", job.id), book.acked("n3", drain.id), book.acked("n3", failed.id))
    assert acks == [True, False, True], "an ack from another node is refused, in the same batch as good ones"
    assert (await book.get(drain.id)).status is CommandStatus.PENDING
    outcomes = await asyncio.gather(  # one group commit: a repeat inside the batch is not recorded twice
        book.finish("n1", found), book.finish("n1", found), book.finish("n2", drained), book.finish("n3", broken)
    )
    assert [(o.known, o.recorded, o.job_id) for o in outcomes] == [
        (True, True, "job-1"),
        (True, False, "job-1"),
        (True, True, None),
        (True, True, None),
    ]
    statuses = [(await book.get(c)).status for c in (job.id, drain.id, failed.id)]
    assert statuses == [CommandStatus.SUCCEEDED, CommandStatus.SUCCEEDED, CommandStatus.FAILED]
    assert (await book.get(failed.id)).message == "no"
    rows = {n.name: n for n in db.transact(lambda s: list(s.scalars(sa.select(NodeRow))))}
    assert b"n1-found" in rows["n1"].topology
    assert rows["n2"].drained is True
    assert b"n3-not-applied" not in rows["n3"].topology, "a failed command changes nothing about its node"


async def test_drain_result_updates_the_node(db: Database, clock: FakeClock) -> None:
    await registry(db, clock).register(registration("n1"))
    book = CommandBook(db=db, wall_clock=clock.wall_clock)
    record = await book.submit("n1", agent_pb2.Command(drain=agent_pb2.Drain(drained=True)))
    await book.finish("n1", agent_pb2.CommandResult(command_id=record.id, status=agent_pb2.COMMAND_STATUS_SUCCEEDED))
    node = db.transact(lambda s: s.get(NodeRow, "n1"))
    assert node is not None and node.drained is True


async def test_results_from_the_wrong_node_are_ignored(db: Database, clock: FakeClock) -> None:
    nodes = registry(db, clock)
    await nodes.register(registration("n1"))
    await nodes.register(registration("n2"))
    book = CommandBook(db=db, wall_clock=clock.wall_clock)
    record = await book.submit("n1", rediscover())
    result = agent_pb2.CommandResult(command_id=record.id, status=agent_pb2.COMMAND_STATUS_FAILED)
    assert (await book.finish("n2", result)).known is False
    never_sent = agent_pb2.CommandResult(command_id="never-sent", status=agent_pb2.COMMAND_STATUS_FAILED)
    assert (await book.finish("n1", never_sent)).known is False
    assert await book.acked("n2", record.id) is False
    assert (await book.get(record.id)).status is CommandStatus.PENDING


async def test_client_chosen_ids_are_idempotent(db: Database, clock: FakeClock) -> None:
    await registry(db, clock).register(registration("n1"))
    book = CommandBook(db=db, wall_clock=clock.wall_clock)
    first = await book.submit("n1", rediscover(), command_id="mine-1")
    second = await book.submit("n1", rediscover(), command_id="mine-1")
    assert first.id == second.id == "mine-1"
    with pytest.raises(ConflictError, match="mine-1"):
        await book.submit("n1", agent_pb2.Command(drain=agent_pb2.Drain(drained=True)), command_id="mine-1")
    with pytest.raises(NotFoundError, match="ghost"):
        await book.submit("ghost", rediscover())
    assert db.transact(lambda s: s.scalar(sa.select(sa.func.count()).select_from(CommandRow))) == 1


def test_a_failed_transaction_writes_nothing(db: Database) -> None:
    def half_then_fail(session: sa.orm.Session) -> None:
        session.add(EventRow(node_name="x", kind="k", message="", command_id="", at=datetime.now(UTC)))
        session.flush()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        db.transact(half_then_fail)
    assert db.transact(lambda s: s.scalar(sa.select(sa.func.count()).select_from(EventRow))) == 0


def test_integrity_errors_become_storage_errors(db: Database) -> None:
    def orphan(session: sa.orm.Session) -> None:
        wall = datetime.now(UTC)
        session.add(
            CommandRow(
                id="c",
                node_name="nobody",
                kind="k",
                body=b"",
                status="pending",
                deliveries=0,
                message="",
                created_at=wall,
            )
        )

    with pytest.raises(StorageError, match="IntegrityError"):
        db.transact(orphan)
