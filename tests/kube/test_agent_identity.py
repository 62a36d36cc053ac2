"""In a cluster, an agent pod's projected service-account token is its node's agent credential: the API
server's TokenReview (here a fake one on loopback) names the node, and the agent may register as that node
only. Tokens of other service accounts, other audiences or without a node are refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from tests.conftest import controller_settings
from tests.controller.test_services import expect_status, open_session, register
from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import TOKEN_REVIEWS, FakeApiServer
from topo_tune.controller.server import Controller
from topo_tune.errors import ConfigError, KubernetesError
from topo_tune.kube.agent_identity import AgentTokenReviewer
from topo_tune.kube.objects import TokenReview
from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc

AGENTS = "topo-tune:topo-tune-agent"
POD_TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJwb2QiOiJuNCJ9.c2lnbmF0dXJl"  # the shape of a service-account JWT
OTHER_TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJvdGhlciI6MX0.c2lnbmF0dXJl"


@pytest.fixture
async def controller(sqlite_url: str, kube_env: KubeEnvFactory) -> AsyncIterator[Controller]:
    server = Controller(
        controller_settings(sqlite_url, kubernetes=kube_env("controller"), agent_service_account=AGENTS)
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def channel(controller: Controller) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as opened:
        yield opened


async def test_a_pod_token_registers_as_its_own_node_only(channel: grpc.aio.Channel, apiserver: FakeApiServer) -> None:
    apiserver.add_service_account_token(POD_TOKEN, namespace="topo-tune", name="topo-tune-agent", node="n4")
    call = await open_session(channel, register("n4"), token=POD_TOKEN)
    assert (await asyncio.wait_for(call.read(), 10)).registered.node_name == "n4"
    impostor = await open_session(channel, register("n5"), token=POD_TOKEN)
    await expect_status(
        impostor, grpc.StatusCode.PERMISSION_DENIED, "this credential is for node 'n4'; it cannot register as 'n5'"
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await admin_pb2_grpc.AdminServiceStub(channel).ListNodes(
            admin_pb2.ListNodesRequest(), metadata=bearer_metadata(POD_TOKEN)
        )
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    reviews = [r for r in apiserver.requests if r[1] == TOKEN_REVIEWS]
    assert len(reviews) == 1, "one review per token while it is cached"
    refused = await open_session(channel, register("n4"), token="not-a-jwt")
    await expect_status(refused, grpc.StatusCode.UNAUTHENTICATED, "bearer token")
    assert [r for r in apiserver.requests if r[1] == TOKEN_REVIEWS] == reviews, "what is no JWT is never reviewed"
    call.cancel()


@pytest.mark.parametrize(
    ("namespace", "name", "node", "audiences"),
    [
        ("topo-tune", "default", "n4", ("topo-tune",)),
        ("training", "topo-tune-agent", "n4", ("topo-tune",)),
        ("topo-tune", "topo-tune-agent", None, ("topo-tune",)),
        ("topo-tune", "topo-tune-agent", "n4", ("https://kubernetes.default.svc",)),
    ],
    ids=["other-account", "other-namespace", "no-node", "other-audience"],
)
async def test_other_kubernetes_identities_are_unauthenticated(
    channel: grpc.aio.Channel,
    apiserver: FakeApiServer,
    namespace: str,
    name: str,
    node: str | None,
    audiences: tuple[str, ...],
) -> None:
    apiserver.add_service_account_token(OTHER_TOKEN, namespace=namespace, name=name, node=node, audiences=audiences)
    call = await open_session(channel, register("n4"), token=OTHER_TOKEN)
    await expect_status(call, grpc.StatusCode.UNAUTHENTICATED, "bearer token")


async def test_the_agent_service_account_needs_the_kubernetes_api(sqlite_url: str) -> None:
    with pytest.raises(ConfigError, match="--agent-service-account: needs the Kubernetes API"):
        Controller(controller_settings(sqlite_url, agent_service_account=AGENTS))


async def test_a_failed_review_refuses_and_is_asked_again_while_answers_are_cached_for_a_minute() -> None:
    now = [0.0]
    calls: list[str] = []
    answers: list[TokenReview | KubernetesError] = [
        KubernetesError("reviewing a service-account token: 503 ServiceUnavailable", status=503),
        TokenReview(
            authenticated=True,
            username="system:serviceaccount:topo-tune:topo-tune-agent",
            audiences=("topo-tune",),
            extra={"authentication.kubernetes.io/node-name": ("n4",)},
        ),
    ]

    def review(token: str, audiences: list[str]) -> TokenReview:
        calls.append(token)
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, KubernetesError):
            raise answer
        return answer

    reviewer = AgentTokenReviewer(review, service_account=AGENTS, clock=lambda: now[0])
    assert await reviewer.node_of(b"hdr.tok.sig") is None  # the API server is away: refused, not let through
    assert await reviewer.node_of(b"hdr.tok.sig") == "n4"
    assert await reviewer.node_of(b"hdr.tok.sig") == "n4"
    assert calls == ["hdr.tok.sig"] * 2
    now[0] = 61.0
    assert await reviewer.node_of(b"hdr.tok.sig") == "n4"
    assert calls == ["hdr.tok.sig"] * 3
