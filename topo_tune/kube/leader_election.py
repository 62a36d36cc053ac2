"""Leader election on a ``coordination.k8s.io/v1`` Lease, with the semantics of client-go's.

Every candidate tries, every ``retry_period_s``, to acquire or renew the Lease: read it; if another holder's
record has not changed for ``lease_duration_s`` *by this candidate's own clock* (never by comparing the
record's timestamps with the local wall clock, so clock skew between machines does not matter), take it
over (``leaseTransitions`` + 1); writes carry the ``resourceVersion`` they read, so of two candidates that
try at once the API server lets one win and refuses the other with 409 Conflict. A leader that has not
renewed for ``renew_deadline_s`` (shorter than the lease) stops leading at once, before anyone else can
take over. On a graceful stop the leader releases the Lease (empty holder, 1 s duration) so a successor
takes over without waiting for the lease to run out.

client-go warns that this "does not guarantee that only one client is acting as a leader (a.k.a.
fencing)": a paused process may resume believing it leads. So leader-only work must check
``LeaderElector.holds(term)`` right before each write; that fails as soon as the renew deadline has passed
without a renewal, whatever the election loop is doing. A process paused between that check and its write
is stopped by a second fence where the writes land: the term's epoch (``leaseTransitions`` at its start)
fences the database (``topo_tune.controller.db.fence``). A term that finds its epoch already overtaken there
ends with ``StaleTermError``; the elector then releases the Lease and takes it over again only above that
epoch, so a Lease recreated from 0 under an older database catches up instead of failing for ever.

The ``kubernetes`` package ships a ``LeaderElection`` too, but it runs in threads, reads ``time.time()``
directly (no injected clock), cannot release the lease, does not count ``leaseTransitions`` and binds the
process-wide client configuration; this module keeps its algorithm and adds those.

Non-goals: ``preferredHolder``/coordinated leader election (Kubernetes 1.31+ alpha).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from topo_tune.errors import ConfigError, KubernetesError, StaleTermError
from topo_tune.kube.objects import Lease

logger = logging.getLogger(__name__)

JITTER = 1.2
"""Candidates that are not leading wait up to this factor of the retry period (as client-go does)."""


@dataclass(frozen=True)
class LeaderElectionSettings:
    namespace: str
    lease_name: str = "topo-tune-controller"
    identity: str = ""
    """Unique per candidate process (client-go uses ``hostname_uuid``)."""
    lease_duration_s: int = 15
    """How long others wait after the last renewal they saw before taking over (whole seconds, as stored)."""
    renew_deadline_s: float = 10.0
    """How long the leader keeps leading without a successful renewal."""
    retry_period_s: float = 2.0
    pod_name: str = ""
    """This candidate's pod: labelled ``topo-tune.io/leader=true`` while it leads ("" = no label)."""
    fence_idle_timeout_s: float = 5.0
    """PostgreSQL: how long a leader's transaction may sit idle between the database fence's check and its
    commit before the server disconnects it (a frozen leader); a successor's claim waits at most this long."""

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ConfigError("--lease-namespace", "leader election needs the Lease's namespace")
        if not self.lease_name:
            raise ConfigError("--lease-name", "must not be empty")
        if not self.identity:
            raise ConfigError("identity", "leader election needs a unique identity per candidate")
        if self.retry_period_s <= 0:
            raise ConfigError("--retry-period", f"{self.retry_period_s:g} s must be positive")
        if self.renew_deadline_s <= JITTER * self.retry_period_s:
            raise ConfigError(
                "--renew-deadline",
                f"{self.renew_deadline_s:g} s must be longer than {JITTER:g} × the retry period "
                f"({self.retry_period_s:g} s)",
            )
        if not 0.1 <= self.fence_idle_timeout_s <= self.lease_duration_s:
            raise ConfigError(
                "--fence-idle-timeout",
                f"{self.fence_idle_timeout_s:g} s must be between 0.1 s and the lease duration "
                f"({self.lease_duration_s} s): a successor waits that long for a frozen leader's commit",
            )
        if self.lease_duration_s <= self.renew_deadline_s:
            raise ConfigError(
                "--lease-duration",
                f"{self.lease_duration_s} s must be longer than the renew deadline ({self.renew_deadline_s:g} s)",
            )


@dataclass(frozen=True, eq=False)
class LeadershipTerm:
    """One uninterrupted stretch of leadership of this candidate; compared by identity."""

    identity: str
    term: int
    """Counts this candidate's terms (1, 2, …)."""
    transitions: int
    """The Lease's ``leaseTransitions`` when the term began: the cluster-wide epoch."""


class LeaseApi(Protocol):
    """The three Lease calls of ``KubeApi`` (blocking); 409 on a lost race."""

    def read_lease(self, namespace: str, name: str) -> Lease | None: ...
    def create_lease(self, namespace: str, name: str, lease: Lease) -> Lease: ...
    def replace_lease(self, namespace: str, name: str, lease: Lease) -> Lease: ...


OnStarted = Callable[[LeadershipTerm], Coroutine[Any, Any, None]]
OnStopped = Callable[[LeadershipTerm], Awaitable[None]]


class LeaderElector:
    """Campaigns for the Lease until stopped; calls back when leadership begins and ends."""

    def __init__(
        self,
        *,
        api: LeaseApi,
        settings: LeaderElectionSettings,
        on_started_leading: OnStarted,
        on_stopped_leading: OnStopped,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self._api = api
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()
        self._observed: Lease | None = None
        self._observed_at = 0.0
        self._last_renewed = 0.0
        self._term: LeadershipTerm | None = None
        self._starting: asyncio.Task[None] | None = None
        self._terms = 0
        self._last_error = ""
        self._epoch_floor = -1
        """A takeover sets ``leaseTransitions`` above this (the newest epoch a stale term was shown)."""

    @property
    def identity(self) -> str:
        return self.settings.identity

    @property
    def term(self) -> LeadershipTerm | None:
        """The current term while leading, else None."""
        return self._term

    @property
    def observed_holder(self) -> str:
        """The holder in the last Lease this candidate read or wrote ("" before any)."""
        return self._observed.holder if self._observed else ""

    def holds(self, term: LeadershipTerm | None) -> bool:
        """The fence: True only while ``term`` is current and its last renewal is within the renew deadline."""
        return (
            term is not None
            and self._term is term
            and self._clock() - self._last_renewed < self.settings.renew_deadline_s
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign until ``stop`` is set; then stop leading and release the Lease if held.

        ``on_started_leading`` runs as a task beside the renewals (loading state may take longer than the
        renew deadline); a term that ends first cancels it. An exception from it ends the term
        (``on_stopped_leading``, release) and is raised from here: the caller decides whether the process
        can go on.
        """
        try:
            while not stop.is_set():
                await self.step()
                delay = self.settings.retry_period_s
                if self._term is None:
                    delay *= self._rng.uniform(1.0, JITTER)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        finally:
            term = self._term
            if term is not None:
                try:
                    await self._end_term(term, "stopping")
                finally:
                    await self.release()

    async def step(self) -> None:
        """One round: acquire or renew, then start or stop leading as the outcome and the deadline say."""
        started = self._clock()
        budget = self.settings.renew_deadline_s
        if self._term is not None:
            budget = max(0.0, self._last_renewed + self.settings.renew_deadline_s - started)
        try:
            renewed = await asyncio.wait_for(self.try_acquire_or_renew(), budget)
        except TimeoutError:
            renewed = False
            self._note_failure(f"no answer from the API within {budget:.2f} s")
        if renewed:
            self._last_renewed = started
            if self._term is None:
                await self._begin_term()
        elif self._term is not None and self._clock() - self._last_renewed >= self.settings.renew_deadline_s:
            await self._end_term(self._term, f"no renewal for {self.settings.renew_deadline_s:g} s")
        await self._check_start()

    async def _begin_term(self) -> None:
        self._terms += 1
        transitions = self._observed.transitions if self._observed else 0
        term = LeadershipTerm(self.identity, self._terms, transitions)
        self._term = term
        logger.info(
            "became the leader (lease %s/%s, transitions %d)",
            self.settings.namespace,
            self.settings.lease_name,
            transitions,
        )
        self._starting = asyncio.create_task(self._on_started(term), name="leader-work-start")
        await asyncio.sleep(0)  # let it begin now

    async def _check_start(self) -> None:
        task = self._starting
        if task is None or not task.done():
            return
        self._starting = None
        error = None if task.cancelled() else task.exception()
        term = self._term
        if error is None or term is None:
            return
        if isinstance(error, StaleTermError):
            # Not a fault of this process: step down, and take the Lease again only with a newer epoch.
            self._epoch_floor = max(self._epoch_floor, error.newer)
            try:
                await self._end_term(term, str(error))
            finally:
                await self.release()
            return
        logger.error("starting leader work failed; giving up the lease", exc_info=error)
        try:
            await self._end_term(term, "leader work failed to start")
        finally:
            await self.release()
        raise error

    async def _end_term(self, term: LeadershipTerm, why: str) -> None:
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.wait([starting])  # never raises: its outcome no longer matters
        if why == "stopping":
            logger.info("stopped leading")
        else:
            logger.warning("stopped leading: %s", why)
        try:
            await self._on_stopped(term)
        finally:
            self._term = None

    def _note_failure(self, message: str) -> None:
        # A standby fails every round by design; say it once per distinct reason, not every 2 s.
        if message != self._last_error:
            logger.info("lease %s/%s: %s", self.settings.namespace, self.settings.lease_name, message)
            self._last_error = message

    def _observe(self, lease: Lease) -> None:
        if self._observed is None or lease.resource_version != self._observed.resource_version:
            self._observed = lease
            self._observed_at = self._clock()

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this candidate holds the Lease afterwards (acquired or renewed)."""
        s = self.settings
        now = self._wall_clock()
        try:
            current = await asyncio.to_thread(self._api.read_lease, s.namespace, s.lease_name)
            if current is None:
                fresh = Lease(self.identity, s.lease_duration_s, now, now, transitions=self._epoch_floor + 1)
                self._observe(await asyncio.to_thread(self._api.create_lease, s.namespace, s.lease_name, fresh))
                self._last_error = ""
                return True
            self._observe(current)
            ours = current.holder == self.identity
            if not ours and current.holder and self._observed_at + current.lease_duration_s > self._clock():
                self._note_failure(f"held by {current.holder}")
                return False
            updated = Lease(
                holder=self.identity,
                lease_duration_s=s.lease_duration_s,
                # Renewing keeps the acquire time and the epoch; taking over starts a new epoch.
                acquire_time=current.acquire_time if ours else now,
                renew_time=now,
                transitions=current.transitions if ours else max(current.transitions, self._epoch_floor) + 1,
                resource_version=current.resource_version,
            )
            self._observe(await asyncio.to_thread(self._api.replace_lease, s.namespace, s.lease_name, updated))
        except KubernetesError as error:
            self._note_failure("lost the race for the lease" if error.status == 409 else str(error))
            return False
        if not ours:
            logger.info("took over the lease from %s", current.holder or "nobody (released)")
        self._last_error = ""
        return True

    async def release(self) -> bool:
        """Give the Lease up if this candidate holds it, so a successor need not wait for it to expire."""
        s = self.settings
        try:
            current = await asyncio.to_thread(self._api.read_lease, s.namespace, s.lease_name)
            if current is None or current.holder != self.identity:
                return False
            now = self._wall_clock()
            released = Lease(
                holder="",
                lease_duration_s=1,
                acquire_time=now,
                renew_time=now,
                transitions=current.transitions,
                resource_version=current.resource_version,
            )
            self._observe(await asyncio.to_thread(self._api.replace_lease, s.namespace, s.lease_name, released))
        except KubernetesError as error:
            logger.warning("could not release the lease (it will expire): %s", error)
            return False
        logger.info("released the lease %s/%s", s.namespace, s.lease_name)
        return True
