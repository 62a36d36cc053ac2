"""The gRPC services on a real loopback server: auth, malformed input, admin calls, health, metrics."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import controller_settings
from tests.support.processes import TOKEN
from topo_tune.agent import session_call
from topo_tune.controller.server import Controller
from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc


def register(name: str, **fields: object) -> agent_pb2.AgentMessage:
    values: dict[str, object] = {"node_name": name, "backend": agent_pb2.BACKEND_SIM, "instance_id": "i-1"}
    values.update(fields)
    return agent_pb2.AgentMessage(register=agent_pb2.Register(**values))  # type: ignore[arg-type]


@pytest.fixture
async def channel(controller: Controller) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as opened:
        yield opened


async def open_session(
    channel: grpc.aio.Channel, first: agent_pb2.AgentMessage, *, token: str = TOKEN
) -> grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ControllerMessage]:
    """The agent's own way in: a refused call is never written to, so reading it raises the refusal."""
    return await session_call.open_session(agent_pb2_grpc.AgentServiceStub(channel), first, token=token)


async def expect_status(
    call: grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ControllerMessage],
    code: grpc.StatusCode,
    details: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        while True:
            message = await asyncio.wait_for(call.read(), 10)
            if message is grpc.aio.EOF:
                pytest.fail("stream ended without an error status")
    assert caught.value.code() == code
    assert details in (caught.value.details() or "")


@pytest.mark.parametrize("token", ["", "wrong-token"])
async def test_both_services_refuse_a_bad_token(channel: grpc.aio.Channel, token: str) -> None:
    metadata = bearer_metadata(token) if token else None
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await admin_pb2_grpc.AdminServiceStub(channel).ListNodes(admin_pb2.ListNodesRequest(), metadata=metadata)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.details() == "missing or invalid bearer token"

    call = agent_pb2_grpc.AgentServiceStub(channel).Session(metadata=metadata)
    await expect_status(call, grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")


async def test_a_refused_token_registers_nothing(channel: grpc.aio.Channel, controller: Controller) -> None:
    call = await open_session(channel, register("intruder"), token="wrong")
    await expect_status(call, grpc.StatusCode.UNAUTHENTICATED, "bearer token")
    assert await controller.registry.list() == []


async def test_health_is_open_without_a_token(channel: grpc.aio.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "topo_tune.v1.AgentService", "topo_tune.v1.AdminService"):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_registration_heartbeat_and_admin_view(channel: grpc.aio.Channel) -> None:
    call = await open_session(channel, register("n1", rack="r1", labels={"zone": "a"}))
    reply = await call.read()
    assert reply.registered.node_name == "n1"
    assert reply.registered.heartbeat_interval_ms == 200
    await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=7)))
    ack = await call.read()
    assert ack.heartbeat_ack.seq == 7
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    nodes = await admin.ListNodes(admin_pb2.ListNodesRequest(), metadata=bearer_metadata(TOKEN))
    assert [(n.name, n.rack, n.state, dict(n.labels)) for n in nodes.nodes] == [
        ("n1", "r1", admin_pb2.NODE_STATE_READY, {"zone": "a"})
    ]
    call.cancel()


BAD_FIRST_MESSAGES = [
    (agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1)), "register: the first message must register"),
    (register(""), "register.node_name: required"),
    (register("bad name!"), "register.node_name: not a valid node name"),
    (register("x" * 300), "register.node_name: not a valid node name"),
    (register("n1", backend=99), "register.backend: unknown Backend value 99"),
    (register("n1", backend=0), "register.backend: Backend must be set"),
    (register("n1", labels={f"k{i}": "v" for i in range(100)}), "register.labels: 100 labels, at most 64"),
    (register("n1", labels={"k": "v" * 1000}), "register.labels['k']: value longer than 256"),
    (register("n1", agent_version="v" * 1000), "register.agent_version: longer than 64"),
    # A version or id a person reads in `admin nodes`: no terminal escape, no bidi override.
    (register("n1", agent_version="1.0\x1b[2J"), "register.agent_version: holds a control or bidirectional"),
    (register("n1", instance_id="i\u202e1"), "register.instance_id: holds a control or bidirectional"),
    # The address becomes TOPO_TUNE_MASTER_ADDR and a launcher's host: only a host name or an IP literal.
    (register("n1", address="a" * 100_000), "register.address: longer than 253 characters"),
    (register("n1", address="10.0.0.1 --master_port=1"), "register.address: expected a host name or an IP address"),
    (register("n1", address="gpu-a1\nforged"), "register.address: expected a host name or an IP address"),
    (register("n1", address="-oProxyCommand=x"), "register.address: expected a host name or an IP address"),
]


@pytest.mark.parametrize(("message", "details"), BAD_FIRST_MESSAGES, ids=[d for _, d in BAD_FIRST_MESSAGES])
async def test_malformed_registration_is_invalid_argument(
    channel: grpc.aio.Channel, controller: Controller, message: agent_pb2.AgentMessage, details: str
) -> None:
    await expect_refused_registration(channel, controller, message, details)


async def expect_refused_registration(
    channel: grpc.aio.Channel, controller: Controller, message: agent_pb2.AgentMessage, details: str
) -> None:
    """``message`` is refused with INVALID_ARGUMENT saying ``details``, and nothing is stored."""
    call = await open_session(channel, message)
    await expect_status(call, grpc.StatusCode.INVALID_ARGUMENT, details)
    assert await controller.registry.list() == [], "nothing is persisted for a refused registration"


BAD_LATER_MESSAGES = [
    (agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(activity=42)), "heartbeat.activity: unknown AgentActivity"),
    (
        agent_pb2.AgentMessage(result=agent_pb2.CommandResult(command_id="c1")),
        "result.status: CommandStatus must be set",
    ),
    (
        agent_pb2.AgentMessage(result=agent_pb2.CommandResult(command_id="c1", status=agent_pb2.COMMAND_STATUS_ACKED)),
        "result.status: a result must carry a final status",
    ),
    (
        agent_pb2.AgentMessage(result=agent_pb2.CommandResult(command_id="", status=agent_pb2.COMMAND_STATUS_FAILED)),
        "result.command_id: required",
    ),
    (agent_pb2.AgentMessage(ack=agent_pb2.CommandAck(command_id="../etc")), "ack.command_id: not a valid command id"),
    (agent_pb2.AgentMessage(), "kind: message carries none of"),
    (register("n1"), "register: sent twice in one session"),
    (agent_pb2.AgentMessage(event=agent_pb2.AgentEvent()), "event.kind: required"),
]


@pytest.mark.parametrize(("message", "details"), BAD_LATER_MESSAGES, ids=[d for _, d in BAD_LATER_MESSAGES])
async def test_malformed_messages_close_only_that_session(
    channel: grpc.aio.Channel, message: agent_pb2.AgentMessage, details: str
) -> None:
    good = await open_session(channel, register("good"))
    assert (await good.read()).registered.node_name == "good"
    bad = await open_session(channel, register("bad"))
    assert (await bad.read()).registered.node_name == "bad"
    await bad.write(message)
    await expect_status(bad, grpc.StatusCode.INVALID_ARGUMENT, details)
    # The controller keeps serving everyone else.
    await good.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=3)))
    assert (await asyncio.wait_for(good.read(), 10)).heartbeat_ack.seq == 3
    good.cancel()


async def test_results_for_commands_never_sent_are_acknowledged_and_ignored(
    channel: grpc.aio.Channel, controller: Controller
) -> None:
    call = await open_session(channel, register("n1"))
    await call.read()
    forged = agent_pb2.CommandResult(command_id="never-sent", status=agent_pb2.COMMAND_STATUS_SUCCEEDED)
    await call.write(agent_pb2.AgentMessage(result=forged))
    reply = await asyncio.wait_for(call.read(), 10)
    assert reply.result_ack.command_id == "never-sent"
    assert await controller.commands.list() == []
    call.cancel()


async def test_oversized_messages_are_refused(controller: Controller) -> None:
    small = Controller(controller_settings(f"sqlite:///{controller.db.url.database}-2", max_message_bytes=4096))
    await small.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{small.port}") as opened:
            big = register("n1")
            big.register.topology.unknowns.extend(["x" * 1000] * 10)
            call = await open_session(opened, big)
            await expect_status(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "")
            assert await small.registry.list() == []
    finally:
        await small.stop()


async def admin_call(channel: grpc.aio.Channel, method: str, request: object) -> object:
    stub = admin_pb2_grpc.AdminServiceStub(channel)
    return await getattr(stub, method)(request, metadata=bearer_metadata(TOKEN))


@pytest.mark.parametrize(
    ("method", "request_message", "code", "details"),
    [
        ("GetNode", admin_pb2.GetNodeRequest(name=""), grpc.StatusCode.INVALID_ARGUMENT, "name: required"),
        ("GetNode", admin_pb2.GetNodeRequest(name="ghost"), grpc.StatusCode.NOT_FOUND, "no node named 'ghost'"),
        ("ListNodes", admin_pb2.ListNodesRequest(rack="no such rack"), grpc.StatusCode.INVALID_ARGUMENT, "rack:"),
        ("SendCommand", admin_pb2.SendCommandRequest(node_name="n1"), grpc.StatusCode.INVALID_ARGUMENT, "body:"),
        (
            "SendCommand",
            admin_pb2.SendCommandRequest(node_name="ghost", rediscover=agent_pb2.Rediscover()),
            grpc.StatusCode.NOT_FOUND,
            "no node named 'ghost'",
        ),
        ("GetCommand", admin_pb2.GetCommandRequest(command_id="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
        ("ListCommands", admin_pb2.ListCommandsRequest(limit=99999), grpc.StatusCode.INVALID_ARGUMENT, "limit"),
    ],
)
async def test_admin_errors_have_their_own_codes(
    channel: grpc.aio.Channel, method: str, request_message: object, code: grpc.StatusCode, details: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await admin_call(channel, method, request_message)
    assert caught.value.code() == code
    assert details in (caught.value.details() or "")


async def test_command_ids_are_idempotent_and_conflicts_refused(channel: grpc.aio.Channel) -> None:
    call = await open_session(channel, register("n1"))
    await call.read()
    request = admin_pb2.SendCommandRequest(node_name="n1", command_id="op-1", rediscover=agent_pb2.Rediscover())
    first = await admin_call(channel, "SendCommand", request)
    second = await admin_call(channel, "SendCommand", request)
    assert first.command_id == second.command_id == "op-1"  # type: ignore[attr-defined]
    # Delivered once to the connected agent, not once per retry.
    delivered = await asyncio.wait_for(call.read(), 10)
    assert delivered.command.command_id == "op-1"
    assert second.deliveries == 1  # type: ignore[attr-defined]
    conflicting = admin_pb2.SendCommandRequest(node_name="n1", command_id="op-1", drain=agent_pb2.Drain(drained=True))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await admin_call(channel, "SendCommand", conflicting)
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    call.cancel()


async def test_metrics_endpoint(sqlite_url: str) -> None:
    server = Controller(controller_settings(sqlite_url, metrics_listen="127.0.0.1:0"))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as opened:
            call = await open_session(opened, register("n1"))
            await call.read()
            await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1)))
            await call.read()
            url = f"http://127.0.0.1:{server.metrics_port}/metrics"

            def scrape() -> str:
                with urllib.request.urlopen(url, timeout=10) as response:
                    return str(response.read().decode())

            body = await asyncio.to_thread(scrape)
            call.cancel()
        assert "topo_tune_heartbeats_total 1.0" in body
        assert "topo_tune_registrations_total 1.0" in body
        assert "topo_tune_agent_sessions 1.0" in body
    finally:
        await server.stop()


async def test_graceful_stop_reports_not_serving_and_closes_sessions(sqlite_url: str) -> None:
    server = Controller(controller_settings(sqlite_url, health_listen="127.0.0.1:0"))
    await server.start()
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as opened,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as health_channel,
    ):
        call = await open_session(opened, register("n1"))
        await call.read()
        health = health_pb2_grpc.HealthStub(health_channel)
        assert (await health.Check(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.SERVING
        await server.serving.enter_shutdown()
        assert (
            await health.Check(health_pb2.HealthCheckRequest())
        ).status == health_pb2.HealthCheckResponse.NOT_SERVING
        await server.stop()
        await expect_status(call, grpc.StatusCode.UNAVAILABLE, "")


async def test_a_command_goes_out_once_per_session(channel: grpc.aio.Channel, controller: Controller) -> None:
    call = await open_session(channel, register("n1"))
    await call.read()
    record = await controller.commands.submit("n1", agent_pb2.Command(rediscover=agent_pb2.Rediscover()))
    assert await controller.hub.deliver_new(record)
    session = controller.hub._sessions["n1"]
    await controller.hub.resend_outstanding(session)  # as a late re-send at session start would
    assert (await asyncio.wait_for(call.read(), 10)).command.command_id == record.id
    await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=9)))
    assert (await asyncio.wait_for(call.read(), 10)).heartbeat_ack.seq == 9, "no duplicate command before it"
    assert (await controller.commands.get(record.id)).deliveries == 1
    call.cancel()
