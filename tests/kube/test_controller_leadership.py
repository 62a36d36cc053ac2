"""Two controllers electing on the same Lease: one leads, the other stands by; failover and fencing.

Real controllers (gRPC on loopback, one SQLite database shared as a PostgreSQL one would be), the real
kubernetes client, and the fake API server. Timings are short (6 s lease, 3 s renew deadline, 0.3 s retry
period), so a failover takes about 6 s; the renew deadline is no shorter because both controllers share this
test's one event loop, which a machine busy with other tests can hold up for a second or more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.orm import Session

from tests.conftest import controller_settings
from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import FakeApiServer
from tests.support.processes import TOKEN
from tests.support.waiting import async_wait_until
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import EventRow, LeaderEpochRow
from topo_tune.controller.leadership import NOT_LEADER
from topo_tune.controller.server import Controller
from topo_tune.errors import ConfigError, FencedError
from topo_tune.kube.environment import KubeEnvironment
from topo_tune.kube.idleness import IdleVerdict
from topo_tune.kube.leader_election import LeaderElectionSettings
from topo_tune.kube.serving_label import LEADER_LABEL
from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc

AGENT_SERVICE = "topo_tune.v1.AgentService"
ADMIN_SERVICE = "topo_tune.v1.AdminService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LEASE_DURATION_S = 6
RENEW_DEADLINE_S = 3.0
RETRY_PERIOD_S = 0.3
REQUEST_TIMEOUT_S = 6.0
"""A stalled API server's requests time out after this: longer than the renew deadline, so a leader that stops
in time stops on its deadline, not on a failed request."""
SETTLED_S = 60
"""A bound for an election to settle: the retry period's rounds, stretched on a busy machine."""


def election(identity: str, pod_name: str = "") -> LeaderElectionSettings:
    return LeaderElectionSettings(
        namespace="topo-tune",
        identity=identity,
        pod_name=pod_name,
        lease_duration_s=LEASE_DURATION_S,
        renew_deadline_s=RENEW_DEADLINE_S,
        retry_period_s=RETRY_PERIOD_S,
        fence_idle_timeout_s=2.5,
    )


def environment(kube_env: KubeEnvFactory, token: str) -> KubeEnvironment:
    return replace(kube_env(token), request_timeout_s=REQUEST_TIMEOUT_S)


@pytest.fixture
async def pair(
    sqlite_url: str, kube_env: KubeEnvFactory, apiserver: FakeApiServer
) -> AsyncIterator[dict[str, Controller]]:
    for name in ("a", "b"):
        # b's pod still carries the label from a run that crashed while leading (same pod, restarted).
        apiserver.add_pod("topo-tune", pod(name), node="n0", labels={LEADER_LABEL: "true"} if name == "b" else {})
    controllers = {
        name: Controller(
            controller_settings(
                sqlite_url,
                kubernetes=environment(kube_env, name),
                leader_election=election(name, pod(name)),
                controller_id=name,
            )
        )
        for name in ("a", "b")
    }
    for controller in controllers.values():
        await controller.start()
    try:
        yield controllers
    finally:
        for controller in controllers.values():
            await controller.stop()


def pod(name: str) -> str:
    return f"topo-tune-controller-{name}"


def labelled(apiserver: FakeApiServer) -> list[str]:
    """The controller pods that carry the leader label: those the Service routes to."""
    pods = [apiserver.pod("topo-tune", pod(name)) for name in ("a", "b")]
    return [p["metadata"]["name"] for p in pods if p and p["metadata"]["labels"].get(LEADER_LABEL) == "true"]


async def health(controller: Controller) -> dict[str, int]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return {
            service: (await stub.Check(health_pb2.HealthCheckRequest(service=service))).status
            for service in ("", AGENT_SERVICE, ADMIN_SERVICE)
        }


async def list_nodes(controller: Controller) -> admin_pb2.ListNodesResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return await stub.ListNodes(admin_pb2.ListNodesRequest(), metadata=bearer_metadata(TOKEN), timeout=SETTLED_S)


async def the_leader(pair: dict[str, Controller], *, never_two: list[str]) -> Controller:
    """Wait for exactly one leader, checking at every look that there are never two."""

    async def one() -> Controller | None:
        leading = [c for c in pair.values() if c.leading]
        if len(leading) > 1:
            never_two.append(f"both leading at {time.monotonic():.3f}")
        return leading[0] if len(leading) == 1 else None

    return await async_wait_until(one, timeout=SETTLED_S, interval=0.01, what="exactly one leader")


async def test_one_leads_and_the_other_stands_by(pair: dict[str, Controller], apiserver: FakeApiServer) -> None:
    problems: list[str] = []
    leader = await the_leader(pair, never_two=problems)
    standby = next(c for c in pair.values() if c is not leader)
    await asyncio.sleep(5 * RETRY_PERIOD_S)  # several election rounds: the standby must stay a standby
    assert not problems
    assert not standby.leading
    # The Service selects the label: only the leader's pod has it (a stale one from a crash is removed).
    await async_wait_until(
        lambda: _async(labelled(apiserver) == [pod(leader.controller_id)]), timeout=SETTLED_S, what="the leader label"
    )

    assert stored_epoch(leader) == (0, leader.controller_id), "the first leader claimed the Lease's epoch"
    assert leader.db.fence is not None and leader.db.fence.idle_timeout_s == 2.5, "--fence-idle-timeout"
    assert leader.schedule.job_ids() == [
        "drift-check",
        "expiry-sweep",
        "heartbeat-flush",
        "job-pin-retention",
        "retention",
        "rollout-reconcile",
    ]
    assert standby.schedule.job_ids() == []
    assert await standby.schedule.drift_check() is None and await standby.schedule.retain() is None, (
        "a standby measures, deletes nothing"
    )
    assert await health(leader) == {"": SERVING, AGENT_SERVICE: SERVING, ADMIN_SERVICE: SERVING}
    assert await health(standby) == {"": SERVING, AGENT_SERVICE: NOT_SERVING, ADMIN_SERVICE: NOT_SERVING}

    await list_nodes(leader)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await list_nodes(standby)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == NOT_LEADER


@pytest.mark.parametrize("fault", ["unreachable", "stalled"])
async def test_a_leader_that_stops_renewing_is_fenced_off_and_replaced(
    pair: dict[str, Controller], apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """``unreachable``: the API answers 503. ``stalled``: it never answers (requests time out after 6 s,
    longer than the 3 s renew deadline, so the leader must stop on its deadline, not on the timeout)."""
    problems: list[str] = []
    old = await the_leader(pair, never_two=problems)
    new = next(c for c in pair.values() if c is not old)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{old.port}") as channel:
        call = agent_pb2_grpc.AgentServiceStub(channel).Session(metadata=bearer_metadata(TOKEN))
        register = agent_pb2.Register(node_name="n1", backend=agent_pb2.BACKEND_SIM, instance_id="i-1")
        await call.write(agent_pb2.AgentMessage(register=register))
        assert (await call.read()).WhichOneof("kind") == "registered"

        getattr(apiserver, fault).add(old.controller_id)  # the old leader can no longer reach the API server
        cut_at = time.monotonic()
        await async_wait_until(
            lambda: _async(not old.leading), timeout=SETTLED_S, interval=0.01, what="the old leader to stop"
        )
        stopped_after = time.monotonic() - cut_at
        assert stopped_after < REQUEST_TIMEOUT_S, (
            f"the renew deadline is {RENEW_DEADLINE_S:g} s; the old leader stopped after {stopped_after:.2f} s"
        )

        with pytest.raises(grpc.aio.AioRpcError) as closed:
            while True:
                await asyncio.wait_for(call.read(), 5)
        assert closed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "no longer the leader" in (closed.value.details() or "")

    assert old.schedule.job_ids() == []
    assert (await health(old))[AGENT_SERVICE] == NOT_SERVING
    with caplog.at_level(logging.WARNING):
        await old.schedule.sweep()  # a job that was already running when leadership was lost
    assert "expiry sweep skipped: not the leader" in caplog.text

    assert await the_leader(pair, never_two=problems) is new
    assert not problems, problems
    # A leader cut off from the API cannot take its label off: its calls are refused meanwhile (UNAVAILABLE,
    # retried by clients); the new leader's pod is labelled within a round.
    await async_wait_until(
        lambda: _async(pod(new.controller_id) in labelled(apiserver)), timeout=SETTLED_S, what="the new leader's label"
    )
    assert time.monotonic() - cut_at >= LEASE_DURATION_S - 0.5, "the new leader waited for the lease to run out"
    assert (await health(new))[ADMIN_SERVICE] == SERVING
    assert [n.name for n in (await list_nodes(new)).nodes] == ["n1"], "the new leader reloaded the registry"
    assert apiserver.lease("topo-tune", "topo-tune-controller")["spec"]["leaseTransitions"] == 1  # type: ignore[index]
    # The database follows the Lease: the new leader claimed epoch 1, so the old one (paused past its in-process
    # fence, say) can commit nothing more.
    assert stored_epoch(new) == (1, new.controller_id)
    with pytest.raises(FencedError, match="led epoch 0, but the database is at epoch 1"):
        await old.db.run(add_event("from-the-old-leader"))


async def test_a_leader_that_shuts_down_hands_over_without_waiting(
    pair: dict[str, Controller], apiserver: FakeApiServer
) -> None:
    problems: list[str] = []
    old = await the_leader(pair, never_two=problems)
    await async_wait_until(
        lambda: _async(pod(old.controller_id) in labelled(apiserver)), timeout=SETTLED_S, what="label"
    )
    await old.stop()
    assert pod(old.controller_id) not in labelled(apiserver), "the label leaves with the process"
    stopped_at = time.monotonic()
    new = await the_leader(pair, never_two=problems)
    assert new is not old
    assert time.monotonic() - stopped_at < LEASE_DURATION_S / 2, "the released lease is taken at once"
    del pair[old.controller_id]  # stopped already


async def test_a_term_behind_the_databases_epoch_ends_and_the_lease_is_taken_above_it(
    sqlite_url: str, kube_env: KubeEnvFactory, apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The database outlived its Lease (namespace recreated, external PostgreSQL kept): it is at epoch 5 while
    the new Lease starts at 0. The first term is stale, ends, and the next takeover starts at epoch 6."""
    db = Database(sqlite_url)
    db.migrate()
    db.claim_epoch(5, holder="gone", at=datetime(2026, 1, 1, tzinfo=UTC))
    db.close()
    controller = Controller(
        controller_settings(
            sqlite_url, kubernetes=environment(kube_env, "a"), leader_election=election("a"), controller_id="a"
        )
    )
    with caplog.at_level(logging.WARNING):
        await controller.start()
        try:
            await async_wait_until(lambda: _async(controller.leading), timeout=SETTLED_S, what="a term above epoch 5")
            assert "stopped leading: the term's epoch 0 is behind epoch 5" in caplog.text
            assert caplog.text.count("is behind epoch") == 1, "one stale term, then a takeover above the database"
            assert apiserver.lease("topo-tune", "topo-tune-controller")["spec"]["leaseTransitions"] == 6  # type: ignore[index]
            assert stored_epoch(controller) == (6, "a")
            assert (await health(controller))[""] == SERVING, "a stale term is not a fault: no restart"
            await controller.db.run(add_event("leader-work"))
        finally:
            await controller.stop()


def stored_epoch(controller: Controller) -> tuple[int, str]:
    row = controller.db.transact(lambda s: s.get_one(LeaderEpochRow, 1))
    return row.epoch, row.holder


def add_event(kind: str) -> Callable[[Session], None]:
    def work(session: Session) -> None:
        session.add(EventRow(node_name="n1", kind=kind, message="", command_id="", at=datetime.now(UTC)))

    return work


async def test_leader_election_needs_the_kubernetes_api(sqlite_url: str) -> None:
    with pytest.raises(ConfigError, match="--leader-election: needs the Kubernetes API"):
        Controller(controller_settings(sqlite_url, leader_election=election("a")))


async def test_the_idleness_check_is_injectable(sqlite_url: str) -> None:
    class Busy:
        async def check(self, node_name: str) -> IdleVerdict:
            return IdleVerdict(node_name, idle=False, reason="test")

    controller = Controller(controller_settings(sqlite_url), idleness=Busy())
    assert not (await controller.idleness.check("n1")).idle
    plain = Controller(controller_settings(sqlite_url))
    assert (await plain.idleness.check("n1")).reason == "not running in Kubernetes: not checked"


async def _async(value: bool) -> bool:
    return value


async def test_a_leader_that_cannot_start_its_work_gives_up_and_reports_unhealthy(
    tmp_path: Path, kube_env: KubeEnvFactory, apiserver: FakeApiServer
) -> None:
    garbage = tmp_path / "db.sqlite"
    garbage.write_bytes(b"not a database" * 100)  # migrating it fails at once (not a transient error)
    broken = f"sqlite:///{garbage}"
    controller = Controller(controller_settings(broken, kubernetes=kube_env("a"), leader_election=election("a")))
    await controller.start()
    try:
        await async_wait_until(
            lambda: _health_is(controller, "", NOT_SERVING), timeout=SETTLED_S, what="liveness to fail"
        )
        assert not controller.leading
        lease = apiserver.lease("topo-tune", "topo-tune-controller")
        assert lease is not None
        assert lease["spec"].get("holderIdentity") is None, "released for a replica that can lead"
    finally:
        await controller.stop()


async def _health_is(controller: Controller, service: str, status: int) -> bool:
    return (await health(controller))[service] == status
