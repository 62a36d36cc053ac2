"""Roles on a real loopback server: admin (everything), agent (its own node's session), job (pinned config).

Also the bearer-token details every caller meets first: the ``Bearer `` prefix is required, and an unknown
method is ``UNAUTHENTICATED`` before it is ``UNIMPLEMENTED``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from tests.controller.test_services import expect_status, open_session, register
from tests.support.processes import TOKEN, Daemon, cli_env, run_cli
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.server import Controller
from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc

CREDENTIALS = Credentials(TOKEN)


@pytest.fixture
async def channel(controller: Controller) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as opened:
        yield opened


async def _list_nodes(channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    try:
        await admin_pb2_grpc.AdminServiceStub(channel).ListNodes(admin_pb2.ListNodesRequest(), metadata=metadata)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def test_a_token_without_the_bearer_prefix_is_refused(channel: grpc.aio.Channel) -> None:
    assert await _list_nodes(channel, (("authorization", TOKEN),)) == grpc.StatusCode.UNAUTHENTICATED
    assert await _list_nodes(channel, (("authorization", f"bearer {TOKEN}"),)) == grpc.StatusCode.UNAUTHENTICATED
    assert await _list_nodes(channel, bearer_metadata(TOKEN)) == grpc.StatusCode.OK


async def test_an_unknown_method_is_unauthenticated_before_unimplemented(channel: grpc.aio.Channel) -> None:
    unknown = channel.unary_unary("/topo_tune.v1.AdminService/NoSuchMethod")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unknown(b"")
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unknown(b"", metadata=bearer_metadata(TOKEN))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_issued_credentials_come_from_the_admin_token_only(channel: grpc.aio.Channel) -> None:
    stub = admin_pb2_grpc.AdminServiceStub(channel)
    agent = admin_pb2.IssueCredentialRequest(role=admin_pb2.CREDENTIAL_ROLE_AGENT, node_name="n4")
    issued = await stub.IssueCredential(agent, metadata=bearer_metadata(TOKEN))
    assert issued.token == CREDENTIALS.issue_agent("n4")
    assert issued.token.startswith("topo-tune-agent:n4:")
    for token in (CREDENTIALS.issue_agent("n4"), CREDENTIALS.issue_job()):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.IssueCredential(agent, metadata=bearer_metadata(token))
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    bad = admin_pb2.IssueCredentialRequest(role=admin_pb2.CREDENTIAL_ROLE_AGENT, node_name="bad name!")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.IssueCredential(bad, metadata=bearer_metadata(TOKEN))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("node_name: not a valid node name")


@pytest.mark.parametrize(
    "forged",
    [
        "topo-tune-agent:n4:" + "0" * 64,
        "topo-tune-job:" + "0" * 64,
        Credentials("another cluster's token").issue_agent("n4"),
        CREDENTIALS.issue_agent("n4")[:-1],
    ],
    ids=["agent-mac", "job-mac", "other-cluster", "truncated"],
)
async def test_a_forged_credential_is_unauthenticated(channel: grpc.aio.Channel, forged: str) -> None:
    assert await _list_nodes(channel, bearer_metadata(forged)) == grpc.StatusCode.UNAUTHENTICATED
    call = await open_session(channel, register("n4"), token=forged)
    await expect_status(call, grpc.StatusCode.UNAUTHENTICATED, "bearer token")


async def test_an_agent_credential_serves_only_its_session(channel: grpc.aio.Channel) -> None:
    token = CREDENTIALS.issue_agent("n4")
    assert await _list_nodes(channel, bearer_metadata(token)) == grpc.StatusCode.PERMISSION_DENIED
    call = await open_session(channel, register("n4"), token=token)
    assert (await asyncio.wait_for(call.read(), 10)).registered.node_name == "n4"
    call.cancel()


async def test_a_job_credential_is_refused_by_bench_run_and_reads_its_pinned_config(controller: Controller) -> None:
    env = cli_env(TOPO_TUNE_TOKEN=CREDENTIALS.issue_job(), TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}")
    bench = await asyncio.to_thread(run_cli, "admin", "bench", "run", "--nodes", "n1,n2", env=env)
    assert bench.returncode == 1, bench.stdout + bench.stderr
    assert bench.stderr.strip() == (
        f"topo-tune: error: controller 127.0.0.1:{controller.port} refused: "
        "job credentials may not call /topo_tune.v1.AdminService/StartBenchmark"
    )
    for command in (["admin", "nodes"], ["admin", "credential", "issue", "--job"]):
        refused = await asyncio.to_thread(run_cli, *command, env=env)
        assert refused.returncode == 1 and "job credentials may not call" in refused.stderr, command
    # What a job does need: its pinned config (with no version anywhere, NCCL's defaults: an empty version).
    args = ("env", "--nodes", "n1,n2", "--node", "n2", "--job-id", "j1", "-o", "json")
    pinned = await asyncio.to_thread(run_cli, *args, env=env)
    assert pinned.returncode == 0, pinned.stderr
    assert '"job_id": "j1"' in pinned.stdout and '"TOPO_TUNE_NODE_RANK": "1"' in pinned.stdout, "and its order"


async def test_a_node_cannot_register_as_another_and_the_real_agent_stays_up(
    controller: Controller, channel: grpc.aio.Channel, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{controller.port}"
    admin_env = cli_env(TOPO_TUNE_CONTROLLER=address)
    issued = await asyncio.to_thread(run_cli, "admin", "credential", "issue", "--node", "n4", env=admin_env)
    assert issued.returncode == 0, issued.stderr
    token_file = tmp_path / "n4.token"
    token_file.write_text(issued.stdout)
    agent_env = {k: v for k, v in cli_env().items() if k != "TOPO_TUNE_TOKEN"}
    agent = Daemon(
        ["agent", "run", "--controller", address, "--node-name", "n4", "--backend", "sim", "--token-file",
         str(token_file), "--state-dir", str(tmp_path / "state"), "--config-dir", str(tmp_path / "config")],
        tmp_path / "agent.log",
        env=agent_env,
    ).start()  # fmt: skip
    try:
        for _ in range(400):
            if "n4" in controller.hub._sessions:
                break
            await asyncio.sleep(0.05)
        session = controller.hub._sessions["n4"]
        registered_at = (await controller.registry.get("n4")).registered_at

        impostor = await open_session(channel, register("n4"), token=CREDENTIALS.issue_agent("n5"))
        await expect_status(
            impostor, grpc.StatusCode.PERMISSION_DENIED, "this credential is for node 'n5'; it cannot register as"
        )
        job = await open_session(channel, register("n4"), token=CREDENTIALS.issue_job())
        await expect_status(job, grpc.StatusCode.PERMISSION_DENIED, "job credentials may not call")

        await asyncio.sleep(1.0)  # five heartbeat intervals: a closed stream would have shown by now
        assert controller.hub._sessions.get("n4") is session, "the real agent's session was replaced"
        assert session.close_reason == ""
        assert (await controller.registry.get("n4")).registered_at == registered_at
        assert agent.alive()
    finally:
        agent.kill()


def test_issued_credentials_are_stable_across_releases() -> None:
    # Golden values: a change here would revoke every agent and job credential deployed with the old code.
    assert CREDENTIALS.issue_agent("gpu-07") == (
        "topo-tune-agent:gpu-07:bc01d51f948dc6fb97e72e0c5ff8f16073f23f9d03768cb7b14403963d0c68c8"
    )
    # A job credential's MAC covers its nonce and scope, so one format serves every release from this one on.
    assert CREDENTIALS.issue_job("slurm-", nonce="0123456789abcdef") == (
        "topo-tune-job:0123456789abcdef:55c7f0c6ab2ab2ad534ea9fb6d586c85f598abeed5bb51c83820c570d14f5808:slurm-"
    )


def test_every_job_credential_is_distinct_and_the_shared_one_is_retired() -> None:
    first, second = CREDENTIALS.issue_job(), CREDENTIALS.issue_job()
    assert first != second
    assert CREDENTIALS.identify(first.encode()) != CREDENTIALS.identify(second.encode())
    # The one job credential of earlier releases (a MAC over a constant) acted for every job: refused now.
    retired = b"topo-tune-job:9fe8bfe246efb196c21923a848091379a55f5c3c14c509ad55fe5f193c4b6dd4"
    assert CREDENTIALS.identify(retired) is None
    # The scope is under the MAC: widening it (here: to every job id) makes the token unknown.
    scoped = CREDENTIALS.issue_job("team-a-")
    assert CREDENTIALS.identify(scoped.removesuffix("team-a-").encode()) is None
    assert CREDENTIALS.identify(scoped.encode()) is not None
