"""A PostgreSQL server restarted or briefly down under a running controller: retries, no crash, no loss."""

from __future__ import annotations

import asyncio

import grpc.aio
import pytest
import sqlalchemy as sa

from tests.conftest import controller_settings
from tests.controller.test_services import open_session, register
from tests.support.postgres import PostgresServer
from topo_tune.command_record import CommandStatus
from topo_tune.controller.db.models import CommandRow, NodeRow
from topo_tune.controller.server import Controller
from topo_tune.v1 import agent_pb2

pytestmark = pytest.mark.postgres


async def test_controller_survives_a_database_restart(postgres: PostgresServer) -> None:
    url = postgres.new_database()
    controller = Controller(controller_settings(url))
    await controller.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            first = await open_session(channel, register("n1"))
            await first.read()

            await asyncio.to_thread(postgres.restart)  # every pooled connection is now broken

            # Work that needs the database goes through (pre-ping and retries), nothing is lost.
            record = await controller.commands.submit("n1", agent_pb2.Command(rediscover=agent_pb2.Rediscover()))
            await controller.hub.deliver_new(record)
            delivered = await asyncio.wait_for(first.read(), 10)
            assert delivered.command.command_id == record.id
            second = await open_session(channel, register("n2"))
            assert (await second.read()).registered.node_name == "n2"

            # A database that is down for a while: calls wait and succeed once it is back.
            await asyncio.to_thread(postgres.halt)
            pending = asyncio.create_task(
                controller.commands.submit("n2", agent_pb2.Command(rediscover=agent_pb2.Rediscover()))
            )
            await asyncio.sleep(1.0)  # the submit is retrying against a stopped server meanwhile
            assert not pending.done()
            await asyncio.to_thread(postgres.resume)
            stored = await asyncio.wait_for(pending, 60)
            assert stored.status is CommandStatus.PENDING

            await first.write(
                agent_pb2.AgentMessage(
                    result=agent_pb2.CommandResult(command_id=record.id, status=agent_pb2.COMMAND_STATUS_SUCCEEDED)
                )
            )
            assert (await asyncio.wait_for(first.read(), 10)).result_ack.command_id == record.id
            first.cancel()
            second.cancel()
    finally:
        await controller.stop()

    engine = sa.create_engine(url)
    with engine.connect() as connection:
        names = connection.execute(sa.select(NodeRow.name).order_by(NodeRow.name)).scalars().all()
        commands = connection.execute(sa.select(CommandRow.status).order_by(CommandRow.created_at)).scalars().all()
    engine.dispose()
    assert names == ["n1", "n2"]
    assert commands == ["succeeded", "pending"]
