"""Callers with a credential who send what they should not, against a real controller process over loopback.

- An agent whose heartbeat damage and events hold newlines, ANSI escapes and forged log lines: the
  controller's human log shows them escaped on the line of the record, bounded, and only a few per node.
- A job credential sending bytes that are not the request message to an admin method: ``INVALID_ARGUMENT``
  naming the request, one log line per call and no traceback (as for every other unary method).
- An admin sending a config version larger than any that could pass its checks: refused by its length, the
  sizes named; one a little smaller is parsed and refused naming the file that is too large.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from tests.support.processes import TOKEN, Daemon, free_port, run_cli
from tests.support.waiting import STARTUP_TIMEOUT_S, wait_until
from topo_tune.controller.api.validation import PUT_CONFIG_VERSION_BYTES
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.names import MAX_LABEL_KEY, MAX_LABEL_VALUE, MAX_LABELS
from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc
from topo_tune.versions.version import FILE_NAMES, MAX_FILE_BYTES

FORGED = "12:00:00.000 INFO    topo_tune.controller.server: FORGED admin token accepted"
HOSTILE = f"files changed\n{FORGED}\r\n\x1b[2J\x1b[31mred\u2028{'y' * 5000}"
CHANGES = 30
BURST = 5  # LogGate's default: lines of one kind let through per node per minute


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Daemon]]:
    workdir = tmp_path_factory.mktemp("hostile")
    address = f"127.0.0.1:{free_port()}"
    daemon = Daemon(
        ["controller", "serve", "--listen", address, "--database", f"sqlite:///{workdir / 'db.sqlite'}"],
        workdir / "controller.log",  # the default, human log format
    ).start()
    try:
        wait_until(
            lambda: run_cli("admin", "nodes", "--controller", address).returncode == 0,
            timeout=STARTUP_TIMEOUT_S,
            what="serving",
        )
        yield address, daemon
    finally:
        daemon.kill()


async def _hostile_agent(address: str) -> None:
    metadata = bearer_metadata(Credentials(TOKEN).issue_agent("hostile"))
    async with grpc.aio.insecure_channel(address) as channel:
        call = agent_pb2_grpc.AgentServiceStub(channel).Session(metadata=metadata)
        register = agent_pb2.Register(node_name="hostile", backend=agent_pb2.BACKEND_SIM)
        await call.write(agent_pb2.AgentMessage(register=register))
        assert (await call.read()).HasField("registered")
        for seq in range(1, CHANGES + 1):
            damage = f"{seq}: {HOSTILE}"  # a new text each time: every heartbeat is a change of damage
            event = agent_pb2.AgentEvent(kind="k\n\x1b[2J12:00:00.000 INFO", message=f"{seq}: {HOSTILE}")
            await call.write(agent_pb2.AgentMessage(event=event))
            await call.write(agent_pb2.AgentMessage(ack=agent_pb2.CommandAck(command_id=f"never-sent-{seq}")))
            await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq, config_damage=damage)))
        while True:  # the last heartbeat acknowledged: everything before it was handled
            reply = await asyncio.wait_for(call.read(), 20)
            assert isinstance(reply, agent_pb2.ControllerMessage), "the session ended"
            if reply.WhichOneof("kind") == "heartbeat_ack" and reply.heartbeat_ack.seq == CHANGES:
                break
        call.cancel()


def test_agent_text_is_logged_escaped_bounded_and_rate_limited(controller: tuple[str, Daemon]) -> None:
    address, daemon = controller
    asyncio.run(_hostile_agent(address))
    log = daemon.output()
    lines = log.splitlines()
    assert "\x1b" not in log and "\u2028" not in log and "\r" not in log
    assert not [line for line in lines if line.startswith(FORGED[:12])], "a forged line starts a line of its own"
    damaged = [line for line in lines if "active config version damaged" in line]
    events = [line for line in lines if "agent event" in line]
    unknown = [line for line in lines if "ack for an unknown command" in line]
    assert len(damaged) == len(events) == len(unknown) == BURST, (len(damaged), len(events), len(unknown))
    for line in damaged + events:
        assert "\\n12:00:00.000 INFO" in line and "\\x1b[2J" in line and "\\u2028" in line, line
        assert "characters in all)" in line and len(line) < 2000, line  # 5,000 characters cut
        assert "node=hostile" in line


async def _undecodable(address: str, method: str, token: str, *, streaming: bool) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as channel:
        shape = channel.unary_stream if streaming else channel.unary_unary
        call = shape(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            reply = call(b"\xff\xff\xff\xff", metadata=bearer_metadata(token), timeout=20)
            if streaming:
                async for _ in reply:  # type: ignore[union-attr]
                    pass
            else:
                await reply  # type: ignore[misc]
        return caught.value


def test_an_undecodable_admin_request_is_invalid_argument_with_one_log_line(controller: tuple[str, Daemon]) -> None:
    address, daemon = controller
    calls = [
        ("/topo_tune.v1.AdminService/ResolveJobConfig", Credentials(TOKEN).issue_job(), False),
        ("/topo_tune.v1.AdminService/PutConfigVersion", TOKEN, False),
        ("/topo_tune.v1.AdminService/WatchRollout", TOKEN, True),
    ] * 10
    for method, token, streaming in calls:
        error = asyncio.run(_undecodable(address, method, token, streaming=streaming))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (method, error.code(), error.details())
        name = method.rpartition("/")[2]
        assert error.details() == f"request: the body is not a valid {name} request message"
    log = daemon.output()
    assert "Traceback" not in log and "DecodeError" not in log, log[-3000:]
    assert log.count("refused a request to /topo_tune.v1.AdminService/") == len(calls)


def test_the_largest_config_version_that_can_pass_its_checks_is_within_the_length_bound() -> None:
    four_bytes = "\U0001f600"  # the label limits count characters: each of these is 4 bytes in UTF-8
    largest = admin_pb2.PutConfigVersionRequest(
        files={name: "x" * MAX_FILE_BYTES for name in FILE_NAMES},
        provenance={
            f"{i:03d}" + four_bytes * (MAX_LABEL_KEY - 3): four_bytes * MAX_LABEL_VALUE for i in range(MAX_LABELS)
        },
        id="cv-0123456789abcdef",
    )
    assert largest.ByteSize() <= PUT_CONFIG_VERSION_BYTES < 9 << 20


async def _put(address: str, request: admin_pb2.PutConfigVersionRequest) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await admin_pb2_grpc.AdminServiceStub(channel).PutConfigVersion(
                request, metadata=bearer_metadata(TOKEN), timeout=20
            )
        return caught.value


def test_a_config_version_too_large_to_be_valid_is_refused_by_its_length(controller: tuple[str, Daemon]) -> None:
    address, daemon = controller
    over = admin_pb2.PutConfigVersionRequest(files={"nccl.conf": "#" * PUT_CONFIG_VERSION_BYTES})
    error = asyncio.run(_put(address, over))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        f"request: the body is {over.ByteSize():,} bytes; a valid PutConfigVersion request is at most "
        f"{PUT_CONFIG_VERSION_BYTES:,}"
    )
    under = admin_pb2.PutConfigVersionRequest(files={"nccl.conf": "#" * (2 * MAX_FILE_BYTES)})
    error = asyncio.run(_put(address, under))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "files['nccl.conf']: larger than 1048576 bytes" in error.details(), error.details()
    assert "Traceback" not in daemon.output()
