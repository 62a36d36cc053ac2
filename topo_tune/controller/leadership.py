"""Leadership: whether this controller may do leader-only work now, the fence, and the standby's refusal.

Leader-only work (the periodic jobs, agent sessions, admin calls) runs while this controller leads. Alone (the
default) it leads from start-up to shutdown. With leader election (Kubernetes, several replicas) it leads
while it holds the Lease: on gaining it the state is reloaded from the database (level-triggered: the
previous leader changed it), on losing it the work ends at once. Every periodic job checks the term (the
fence) before it writes, because Lease-based election cannot promise that a paused ex-leader notices in
time. For a process paused after that check, the database fences too: a new term claims its epoch there
before anything is loaded, and from then on every commit checks it (``db/fence.py``).

A standby refuses agent and admin calls with ``UNAVAILABLE`` (``LeaderOnlyInterceptor``: clients retry,
agents reconnect with backoff); its health service says ``NOT_SERVING`` for those services so that a
readiness probe keeps the Kubernetes Service pointing at the leader, and, in a pod, a label routes the
Service to the leader. Non-goals: the Lease protocol itself (``kube/leader_election.py``) and what
leader-only work consists of (``LeaderWork``, implemented by ``server.Controller``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import grpc

from topo_tune.controller.db.database import Database
from topo_tune.errors import FencedError, StaleTermError
from topo_tune.kube.leader_election import LeaderElectionSettings, LeaderElector, LeadershipTerm
from topo_tune.kube.serving_label import ServingLabel
from topo_tune.security.auth import GuardInterceptor

if TYPE_CHECKING:
    from topo_tune.kube.api import KubeApi

logger = logging.getLogger(__name__)

NOT_LEADER = "this controller is a standby, not the leader; retry (the Service routes to the leader)"


class LeaderOnlyInterceptor(GuardInterceptor):
    """Refuses every call but health checks with ``UNAVAILABLE`` while ``leading()`` is False."""

    def __init__(self, leading: Callable[[], bool]) -> None:
        self._leading = leading

    async def refusal(self, handler_call_details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        return None if self._leading() else (grpc.StatusCode.UNAVAILABLE, NOT_LEADER)


class LeaderWork(Protocol):
    """What a term of leadership starts and ends."""

    async def load_state(self) -> None:
        """Load the state the database holds (after the term's epoch is claimed)."""

    async def begin_leading(self, term: LeadershipTerm) -> None:
        """Start leader-only work; ``term`` is current from now on."""

    async def end_leading(self, term: LeadershipTerm, *, still_holds: bool) -> None:
        """Stop leader-only work at once; ``still_holds``: the term had not lapsed yet (last writes may land)."""

    async def cannot_lead(self) -> None:
        """Leadership can never begin (e.g. the database is unreachable): report the process unhealthy."""


class Leadership:
    """The current term of this controller, if it leads; the elector and the leader label with election."""

    def __init__(
        self,
        *,
        controller_id: str,
        db: Database,
        work: LeaderWork,
        election: LeaderElectionSettings | None = None,
        api: KubeApi | None = None,
    ) -> None:
        self.controller_id = controller_id
        self._db = db
        self._work = work
        self._term: LeadershipTerm | None = None
        self._elector: LeaderElector | None = None
        self._serving_label: ServingLabel | None = None
        """With leader election in a pod: the label that routes the Service to the leader."""
        if election is not None:
            assert api is not None, "leader election needs the Kubernetes API"
            self._elector = LeaderElector(
                api=api, settings=election, on_started_leading=self._started, on_stopped_leading=self.stop_leading
            )
            if election.pod_name:
                self._serving_label = ServingLabel(
                    api=api, namespace=election.namespace, pod_name=election.pod_name, leading=lambda: self.leading
                )
        self._fence_idle_timeout_s = election.fence_idle_timeout_s if election is not None else 5.0
        self._election: asyncio.Task[None] | None = None
        self._election_stop = asyncio.Event()
        self._labelling: asyncio.Task[None] | None = None

    @property
    def leading(self) -> bool:
        """True while this controller may do leader-only work (always, without leader election)."""
        return self.holds(self._term)

    def holds(self, term: LeadershipTerm | None) -> bool:
        """The fence: ``term`` is the current term and, with election, its Lease is fresh."""
        if term is None or term is not self._term:
            return False
        return self._elector is None or self._elector.holds(term)

    async def prepare(self) -> None:
        """Alone: migrate and load before serving, so that a bad database fails start-up before anyone connects."""
        if self._elector is None:
            await asyncio.to_thread(self._db.migrate)
            await self._work.load_state()

    async def start(self) -> None:
        """Alone: lead from now on. With election: campaign for the Lease (and keep the leader label true)."""
        if self._elector is None:
            await self._begin(LeadershipTerm(self.controller_id, term=1, transitions=0))
            return
        self._election_stop = asyncio.Event()
        self._election = asyncio.create_task(self._campaign(self._elector), name="leader-election")
        if self._serving_label is not None:
            period = self._elector.settings.retry_period_s
            self._labelling = asyncio.create_task(
                self._serving_label.run(self._election_stop, period), name="leader-label"
            )

    async def stop(self) -> None:
        """End the last term: stop leading, release the Lease and the leader label."""
        if self._election is not None:
            self._election_stop.set()  # the elector stops leading, then releases the Lease
            await self._election
            self._election = None
            await self._unlabel()
        elif self._term is not None:
            await self.stop_leading(self._term)

    async def stop_leading(self, term: LeadershipTerm) -> None:
        """End leader-only work at once. Pending writes are made only if the term still holds."""
        still_holds = self.holds(term)
        self._term = None  # the fence: from here on no job and no call does leader-only work
        await self._work.end_leading(term, still_holds=still_holds)
        logger.info("no longer leading", extra={"controller": self.controller_id, "term": term.term})

    async def _started(self, term: LeadershipTerm) -> None:
        """On gaining the Lease: migrate, claim the term's epoch, reload the state the previous leader left."""
        await asyncio.to_thread(self._db.migrate)
        await self._claim_epoch(term)
        await self._work.load_state()
        await self._begin(term)

    async def _claim_epoch(self, term: LeadershipTerm) -> None:
        try:
            await asyncio.to_thread(
                self._db.claim_epoch,
                term.transitions,
                holder=term.identity,
                at=datetime.now(UTC),
                idle_timeout_s=self._fence_idle_timeout_s,
            )
        except FencedError as error:
            raise StaleTermError(epoch=term.transitions, newer=error.current) from error

    async def _begin(self, term: LeadershipTerm) -> None:
        self._term = term
        await self._work.begin_leading(term)
        logger.info("leading", extra={"controller": self.controller_id, "term": term.term})

    async def _campaign(self, elector: LeaderElector) -> None:
        try:
            await elector.run(self._election_stop)
        except Exception:
            # Leader work could not start (e.g. the database is unreachable): report the process unhealthy
            # so that kubelet restarts it, rather than idling as a standby that can never lead.
            logger.exception("leader election ended with an error", extra={"controller": self.controller_id})
            await self._work.cannot_lead()

    async def _unlabel(self) -> None:
        """After the last term ended: the label leaves this pod before the process does."""
        if self._labelling is not None:
            await self._labelling
            self._labelling = None
        if self._serving_label is not None:
            await self._serving_label.reconcile()
