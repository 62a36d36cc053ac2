"""Leader election on a Lease, step by step in virtual time, against the fake API server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import pytest

from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import FakeApiServer
from topo_tune.errors import ConfigError
from topo_tune.kube.api import KubeApi
from topo_tune.kube.leader_election import LeaderElectionSettings, LeaderElector, LeadershipTerm, LeaseApi
from topo_tune.kube.objects import Lease

NS, NAME = "topo-tune", "topo-tune-controller"


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Candidate:
    elector: LeaderElector
    clock: Clock
    events: list[str] = field(default_factory=list)


class MakeCandidate(Protocol):
    def __call__(
        self, identity: str, *, api: LeaseApi | None = None, fail_start: bool = False, hold_start: bool = False
    ) -> Candidate: ...


@pytest.fixture
def candidate(kube_env: KubeEnvFactory) -> MakeCandidate:
    def make(
        identity: str, *, api: LeaseApi | None = None, fail_start: bool = False, hold_start: bool = False
    ) -> Candidate:
        clock = Clock()
        events: list[str] = []

        async def started(term: LeadershipTerm) -> None:
            events.append(f"started {term.term} epoch {term.transitions}")
            if fail_start:
                raise RuntimeError("database unreachable")
            if hold_start:  # e.g. a database that takes its time to come up
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    events.append("start cancelled")
                    raise

        async def stopped(term: LeadershipTerm) -> None:
            events.append(f"stopped {term.term}")

        settings = LeaderElectionSettings(
            namespace=NS, lease_name=NAME, identity=identity, lease_duration_s=15, renew_deadline_s=10, retry_period_s=2
        )
        elector = LeaderElector(
            api=api or KubeApi.connect(kube_env(identity)),
            settings=settings,
            on_started_leading=started,
            on_stopped_leading=stopped,
            clock=clock,
        )
        return Candidate(elector, clock, events)

    return make


async def test_the_first_candidate_creates_the_lease_and_leads(
    candidate: MakeCandidate, apiserver: FakeApiServer
) -> None:
    a, b = candidate("a"), candidate("b")
    await a.elector.step()
    await b.elector.step()
    assert a.events == ["started 1 epoch 0"]
    assert a.elector.holds(a.elector.term)
    assert b.elector.term is None
    assert b.elector.observed_holder == "a"
    lease = apiserver.lease(NS, NAME)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 15


async def test_a_silent_leader_is_replaced_only_after_the_lease_duration(
    candidate: MakeCandidate, apiserver: FakeApiServer
) -> None:
    a, b = candidate("a"), candidate("b")
    await a.elector.step()
    term = a.elector.term
    acquired = apiserver.lease(NS, NAME)["spec"]["acquireTime"]  # type: ignore[index]
    await b.elector.step()  # b observes a's record now (by b's clock)

    b.clock.now += 14.9
    await b.elector.step()
    assert b.elector.term is None, "the lease has not run out by b's clock"

    a.clock.now += 10.0  # a has not renewed for its whole renew deadline: the fence closes by itself
    assert not a.elector.holds(term)

    b.clock.now += 0.2
    await b.elector.step()
    assert b.events == ["started 1 epoch 1"]
    spec = apiserver.lease(NS, NAME)["spec"]  # type: ignore[index]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert spec["acquireTime"] != acquired

    await a.elector.step()  # a wakes up past its deadline: it stops before even asking the API
    assert a.events == ["started 1 epoch 0", "stopped 1"]
    a.clock.now += 2
    await a.elector.step()
    assert a.elector.term is None
    assert a.elector.observed_holder == "b"


async def test_renewing_keeps_the_epoch_and_the_acquire_time(
    candidate: MakeCandidate, apiserver: FakeApiServer
) -> None:
    a = candidate("a")
    await a.elector.step()
    first = apiserver.lease(NS, NAME)["spec"]  # type: ignore[index]
    a.clock.now += 2
    await a.elector.step()
    again = apiserver.lease(NS, NAME)["spec"]  # type: ignore[index]
    assert (again["acquireTime"], again["leaseTransitions"]) == (first["acquireTime"], 0)
    assert again["renewTime"] > first["renewTime"]
    assert a.events == ["started 1 epoch 0"], "a renewal is not a new term"


async def test_a_leader_that_cannot_renew_stops_at_its_renew_deadline(
    candidate: MakeCandidate, apiserver: FakeApiServer
) -> None:
    a = candidate("a")
    await a.elector.step()
    term = a.elector.term
    apiserver.unreachable.add("a")
    a.clock.now += 5
    await a.elector.step()
    assert a.elector.holds(term), "one failed renewal within the deadline changes nothing"
    a.clock.now += 5
    await a.elector.step()
    assert a.events == ["started 1 epoch 0", "stopped 1"]
    assert not a.elector.holds(term)

    apiserver.unreachable.clear()  # the record still names a: it takes the lease back as a new term
    a.clock.now += 2
    await a.elector.step()
    assert a.events[-1] == "started 2 epoch 0"
    assert not a.elector.holds(term), "the old term stays fenced off"


@dataclass
class InterleavedApi:
    """Lets another candidate write between this candidate's read and its write."""

    api: KubeApi
    between: Callable[[], None] | None = None

    def read_lease(self, namespace: str, name: str) -> Lease | None:
        lease = self.api.read_lease(namespace, name)
        if self.between is not None:
            self.between()
            self.between = None
        return lease

    def create_lease(self, namespace: str, name: str, lease: Lease) -> Lease:
        return self.api.create_lease(namespace, name, lease)

    def replace_lease(self, namespace: str, name: str, lease: Lease) -> Lease:
        return self.api.replace_lease(namespace, name, lease)


async def test_of_two_takeovers_at_once_the_api_server_lets_one_win(
    candidate: MakeCandidate, apiserver: FakeApiServer, kube_env: KubeEnvFactory
) -> None:
    a = candidate("a")
    await a.elector.step()
    c_api = KubeApi.connect(kube_env("c"))
    b_api = InterleavedApi(KubeApi.connect(kube_env("b")))
    b = candidate("b", api=b_api)
    await b.elector.step()
    b.clock.now += 16  # a's lease ran out by b's clock

    def c_takes_over() -> None:
        current = c_api.read_lease(NS, NAME)
        assert current is not None
        c_api.replace_lease(NS, NAME, Lease("c", 15, None, None, current.transitions + 1, current.resource_version))

    b_api.between = c_takes_over
    await b.elector.step()
    assert b.elector.term is None, "b wrote with the resourceVersion it read before c's write: 409"
    assert apiserver.lease(NS, NAME)["spec"]["holderIdentity"] == "c"  # type: ignore[index]
    assert any(method == "PUT" and token == "b" for method, _path, token in apiserver.requests)


async def test_a_released_lease_is_taken_at_once(candidate: MakeCandidate, apiserver: FakeApiServer) -> None:
    a, b = candidate("a"), candidate("b")
    await a.elector.step()
    await b.elector.step()
    assert await a.elector.release()
    assert apiserver.lease(NS, NAME)["spec"].get("holderIdentity") is None  # type: ignore[index]
    await b.elector.step()  # no waiting for the 15 s lease
    assert b.events == ["started 1 epoch 1"]
    assert not await a.elector.release(), "a no longer holds it: nothing to release"


async def test_leader_work_that_fails_to_start_gives_the_lease_back(
    candidate: MakeCandidate, apiserver: FakeApiServer
) -> None:
    a = candidate("a", fail_start=True)
    with pytest.raises(RuntimeError, match="database unreachable"):
        await a.elector.step()
    assert a.events == ["started 1 epoch 0", "stopped 1"]
    assert apiserver.lease(NS, NAME)["spec"].get("holderIdentity") is None  # type: ignore[index]


@pytest.mark.parametrize(
    ("values", "flag"),
    [
        ({"namespace": ""}, "--lease-namespace"),
        ({"lease_name": ""}, "--lease-name"),
        ({"identity": ""}, "identity"),
        ({"retry_period_s": 0}, "--retry-period"),
        ({"renew_deadline_s": 2.3}, "--renew-deadline"),
        ({"lease_duration_s": 10}, "--lease-duration"),
        ({"fence_idle_timeout_s": 0.05}, "--fence-idle-timeout"),
        ({"fence_idle_timeout_s": 20.0}, "--fence-idle-timeout"),  # past the 15 s lease: a takeover could stall
    ],
)
def test_settings_that_could_give_two_leaders_are_refused(values: dict[str, object], flag: str) -> None:
    base: dict[str, object] = {"namespace": NS, "identity": "a", "renew_deadline_s": 10.0, "retry_period_s": 2.0}
    with pytest.raises(ConfigError) as caught:
        LeaderElectionSettings(**{**base, **values})  # type: ignore[arg-type]
    assert caught.value.field == flag


async def test_renewals_go_on_while_leader_work_is_starting(candidate: MakeCandidate, apiserver: FakeApiServer) -> None:
    a = candidate("a", hold_start=True)
    await a.elector.step()
    first = apiserver.lease(NS, NAME)["spec"]["renewTime"]  # type: ignore[index]
    for _ in range(8):  # 16 s of virtual time: longer than the lease
        a.clock.now += 2
        await a.elector.step()
    assert apiserver.lease(NS, NAME)["spec"]["renewTime"] > first  # type: ignore[index]
    assert a.elector.holds(a.elector.term)

    apiserver.unreachable.add("a")  # the term ends before the slow start finished: the start is cancelled
    a.clock.now += 10
    await a.elector.step()
    assert a.events == ["started 1 epoch 0", "start cancelled", "stopped 1"]
