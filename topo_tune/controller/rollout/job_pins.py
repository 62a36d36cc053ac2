"""The controller's side of "one config per job": the rollout state as a job sees it, and durable pins.

``job_config.resolve`` decides; this module feeds it the state (:func:`job_view`) and stores the first
answer for a job id, so every rank and every later question of that job gets the same version, even from a
controller that restarted meanwhile. When two ranks ask at once, the pin stored first stands.

Non-goals: the choice itself (``topo_tune.job_config``) and pin retention (a scheduled clean-up).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topo_tune.controller.rollout.state import RolloutPhase, WavePhase
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.job_config import JobPin, RolloutView, resolve


async def job_view(store: RolloutStore) -> RolloutView:
    snapshot = await store.active()
    if snapshot is None:
        return RolloutView(stable_version=await store.stable_version())
    rollout = snapshot.rollout
    if rollout.phase is RolloutPhase.ROLLING_BACK:
        return RolloutView(stable_version=rollout.previous_version, rollout_id=rollout.id)
    migrated = frozenset(n for w in snapshot.waves if w.phase is WavePhase.COMPLETED for n in w.nodes)
    return RolloutView(
        stable_version=rollout.previous_version,
        new_version=rollout.config_version,
        migrated_nodes=migrated,
        rollout_id=rollout.id,
    )


@dataclass(frozen=True)
class ResolvedJob:
    pin: JobPin
    files: tuple[str, ...]
    rollout_id: str


@dataclass
class JobResolver:
    store: RolloutStore

    async def resolve(self, job_id: str, nodes: Sequence[str]) -> ResolvedJob:
        existing = await self.store.get_pin(job_id)
        view = await job_view(self.store)
        pin = resolve(job_id, nodes, view, {job_id: existing} if existing is not None else {})
        if existing is None:
            pin = await self.store.pin(pin, rollout_id=view.rollout_id)
        files = tuple(sorted(await self.store.versions.files(pin.version))) if pin.version else ()
        return ResolvedJob(pin, files, view.rollout_id)
