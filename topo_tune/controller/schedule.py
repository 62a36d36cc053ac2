"""The periodic jobs of a leading controller, and their schedule.

Six jobs run in APScheduler 3.x (in-memory job store; the intervals come from settings, so they are simply
registered again each time leadership begins): the expiry sweep (nodes gone silent, benchmark jobs past
their deadline), the heartbeat flush, the rollout reconcile pass, job-pin retention, the drift check
(``drift.py``) and the retention of old results (``retention.py``). Each runs one at a time; runs missed
while one was busy collapse into one. Every job is level-triggered, so a run skipped because the last one
was still going (they wait for the one database thread, busy during a registration burst of thousands of
agents) loses nothing: it is counted (``topo_tune_periodic_runs_skipped``) and logged at debug level, not
as APScheduler's warning. A run that fails because the database is unavailable or full logs one line
naming the database, no traceback (the next run tries again). Every job checks leadership first (the
fence): a standby, or a controller whose term just lapsed, does nothing. Non-goal: deciding when
leadership begins and ends (``leadership.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from topo_tune.controller.drift import DriftCheck
from topo_tune.controller.retention import RetentionReport
from topo_tune.controller.settings import ControllerSettings
from topo_tune.controller.wiring import Services, wall_clock
from topo_tune.errors import StorageError

logger = logging.getLogger(__name__)
_SKIPPED = "skipped: maximum number of running instances reached"


class _SkipsAreRoutine(logging.Filter):
    """APScheduler warns of every skipped run; here a skip is routine (see above): debug level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and _SKIPPED in record.getMessage():
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logger.isEnabledFor(logging.DEBUG)
        return True


logging.getLogger("apscheduler.scheduler").addFilter(_SkipsAreRoutine())  # the logger APScheduler's scheduler uses


async def _ends_quietly_on_shutdown(job: Callable[[], Awaitable[object]], job_id: str) -> None:
    """Run one periodic job. The scheduler's shutdown (stop, or no longer leading) cancels a run in flight:
    every periodic job is level-triggered (the next pass or the next leader does it again), so that run ends
    with a log line, not the traceback APScheduler would print for a cancelled job."""
    try:
        await job()
    except asyncio.CancelledError:
        logger.info("periodic job %s cut short by shutdown", job_id)
    except StorageError as error:  # expected while the database is away or full: a line, not a traceback
        logger.warning("periodic job %s failed: %s; the next run tries again", job_id, error)


class Schedule:
    """The periodic jobs: their bodies, and their registration while this controller leads."""

    def __init__(self, services: Services, *, settings: ControllerSettings, leading: Callable[[], bool]) -> None:
        self._services = services
        self._settings = settings
        self._leading = leading
        self._controller_id = services.hub.controller_id
        self._scheduler: AsyncIOScheduler | None = None

    def start(self) -> None:
        scheduler = AsyncIOScheduler(timezone=UTC)
        skipped = self._services.metrics.periodic_runs_skipped

        def on_skip(event: JobSubmissionEvent) -> None:
            skipped.labels(job=event.job_id).inc()

        scheduler.add_listener(on_skip, EVENT_JOB_MAX_INSTANCES)

        def every(seconds: float, job: Callable[[], Awaitable[object]], job_id: str) -> None:
            scheduler.add_job(
                _ends_quietly_on_shutdown,
                "interval",
                args=(job, job_id),
                seconds=seconds,
                id=job_id,
                name=job_id,
                replace_existing=True,
                max_instances=1,
                coalesce=True,
            )

        settings = self._settings
        every(max(0.05, min(1.0, settings.heartbeat_expiry_s / 4)), self.sweep, "expiry-sweep")
        # Every second at most: one second's heartbeats per write (2,000 rows at 20,000 agents), so the event
        # loop never waits long behind one large flush (5 s of them cost 20,000 agents about 25 ms of heartbeat p99).
        every(max(0.1, min(1.0, settings.heartbeat_interval_s)), self.flush, "heartbeat-flush")
        every(settings.rollout_interval_s, self.reconcile_rollouts, "rollout-reconcile")
        every(3600.0, self.prune_job_pins, "job-pin-retention")
        if settings.drift.enabled:
            every(settings.drift.interval, self.drift_check, "drift-check")
        if settings.retention.enabled:
            every(settings.retention.interval, self.retain, "retention")
        scheduler.start()
        self._scheduler = scheduler

    def stop(self) -> None:
        """Unschedule every job; a run in flight is cancelled."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None

    def job_ids(self) -> list[str]:
        """The periodic jobs scheduled now (none on a standby)."""
        return sorted(job.id for job in self._scheduler.get_jobs()) if self._scheduler else []

    async def sweep(self) -> None:
        if not self._leading():
            logger.warning("expiry sweep skipped: not the leader", extra={"controller": self._controller_id})
            return
        services = self._services
        with services.metrics.db_seconds.time():
            services.probes.nodes_lost(await services.registry.sweep())
            await services.jobs.sweep()
        for state, count in services.registry.counts().items():
            services.metrics.nodes.labels(state=state.value).set(count)
        services.metrics.nodes_config_damaged.set(services.registry.damaged())

    async def flush(self) -> None:
        if not self._leading():
            logger.warning("heartbeat flush skipped: not the leader", extra={"controller": self._controller_id})
            return
        await self._services.registry.flush()

    async def reconcile_rollouts(self) -> None:
        """One level-triggered pass over the active rollout; an error is logged and retried next tick."""
        if not self._leading():
            return
        try:
            await self._services.rollouts.reconcile()
        except StorageError as error:
            logger.warning("rollout reconcile pass failed: %s; retrying at the next tick", error)
        except Exception:
            logger.exception("rollout reconcile pass failed; retrying at the next tick")

    async def prune_job_pins(self) -> int:
        if not self._leading():
            return 0
        cutoff = wall_clock() - timedelta(days=self._settings.job_pin_retention_days)
        pruned = await self._services.rollout_store.prune_pins(older_than=cutoff)
        if pruned:
            logger.info("forgot %d job pins older than %s", pruned, cutoff.isoformat())
        return pruned

    async def drift_check(self) -> DriftCheck | None:
        """One drift check of the active config version (None on a standby); an error is logged, not raised."""
        if not self._leading():
            return None
        try:
            return await self._services.drift.check()
        except Exception:
            logger.exception("drift check failed; the next one runs at the next interval")
            return None

    async def retain(self) -> RetentionReport | None:
        """One retention pass (None on a standby)."""
        if not self._leading():
            return None
        return await self._services.retention.run()
