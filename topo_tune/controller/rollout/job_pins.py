"""The controller's side of "one config per job": the rollout state as a job sees it, and durable pins.

``job_config.resolve`` decides the version; ``tuner.job_order`` the node order over the job's nodes from that
version's rank map. This module feeds them the state (:func:`job_view`, the version's files) and stores the
first answer for a job id and arm, version and order together, so every rank and every later question of that
job gets the same ones, even from a controller that restarted meanwhile. When two ranks ask at once, the pin
stored first stands. The address of node rank 0 (``master_addr``) is what its agent registered, read at each
question (the pin holds names, not addresses).

A pin belongs to the job credential that made the job's first one (``tenancy``): another is refused before
anything is read or stored.

Non-goals: the choices themselves (``topo_tune.jobs.config``, ``topo_tune.tuner.ring.job_order``) and pin retention
(a scheduled clean-up).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from topo_tune.config.cluster import JobCapsConfig, LearningConfig
from topo_tune.controller.nodes import NodeRegistry
from topo_tune.controller.rollout.state import RolloutPhase, WavePhase
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.controller.tenancy import ADMIN, CAPS, Tenant, check_row_nodes
from topo_tune.errors import NotFoundError, ValidationError
from topo_tune.ids import NodeName, RolloutId
from topo_tune.jobs.config import JobPin, RolloutView, resolve
from topo_tune.learning.assignment import ArmIndex, Exploration, LearningSwitches, assign_arm
from topo_tune.tuner.ring.job_order import JobOrder, job_order, pinned_order
from topo_tune.versions.version import RANK_MAP, challenger_count

logger = logging.getLogger(__name__)


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
    rollout_id: RolloutId
    order: JobOrder
    """The pinned order with what the version's pair matrix predicts for it and for the launcher's order."""
    master_addr: str = ""
    timing_sample: int = 0
    """With a learning pin: the profiler times one call in this many (cluster.yaml's ``learning.timingSample``)."""


JobNodesLookup = Callable[[str, float], Awaitable[list[str]]]
"""(job id, seconds to wait) → the job's nodes, read from the scheduler (Kubernetes: ``kube.job_nodes``)."""


@dataclass
class JobResolver:
    store: RolloutStore
    registry: NodeRegistry | None = None
    """Where node rank 0's address comes from; without one, ``master_addr`` is its node name."""
    job_nodes: JobNodesLookup | None = None
    """Looks a job's nodes up when it names none (Kubernetes mode); None: a job must name its nodes."""

    async def nodes_of(self, job_id: str, *, arm: str, wait_s: float) -> list[str]:
        """A job's nodes when it names none: its pin's (any rank asked before), else the scheduler's answer."""
        for pinned_arm in dict.fromkeys((arm, "")):
            pin = await self.store.get_pin(job_id, arm=pinned_arm)
            if pin is not None:
                return list(pin.nodes)
        if self.job_nodes is None:
            raise ValidationError(
                "nodes", "a job needs at least one node (only a controller in Kubernetes mode looks a job's nodes "
                "up, from the uid of its Job or JobSet)"
            )  # fmt: skip
        return await self.job_nodes(job_id, wait_s)

    caps: JobCapsConfig = CAPS
    learning: LearningConfig = dataclasses.field(default_factory=LearningConfig)
    """The cluster's switch for learning and its share and sampling (cluster.yaml's ``learning``)."""

    async def resolve(
        self,
        job_id: str,
        nodes: Sequence[str],
        *,
        arm: str = "",
        preview: bool = False,
        tenant: Tenant = ADMIN,
        may_learn: bool = False,
    ) -> ResolvedJob:
        """The job's pin for ``arm`` (see ``job_config.arm_version``), stored unless ``preview``; refused when
        the job is not ``tenant``'s (``tenancy``). A new pin of the job's own config (arm "") of a job that
        ``may_learn`` gets its learning arm when every switch allows (:meth:`_learning_arm`)."""
        check_row_nodes(self.caps, nodes, "nodes")
        if job_id:
            tenant.check_job(job_id)
            tenant.check_owner(job_id, await self.store.pin_owner(job_id))
        existing = await self.store.get_pin(job_id, arm=arm) if job_id else None
        view = await job_view(self.store)
        pin = resolve(job_id or "preview", nodes, view, {job_id: existing} if existing else {}, arm=arm)
        files = await self.store.versions.files(pin.version) if pin.version else {}
        rank_map = files.get(RANK_MAP)
        planned = job_order(rank_map, pin.nodes, version=pin.version)
        if existing is None:
            learning = await self._learning_arm(pin, files, may_learn=may_learn)
            pin = dataclasses.replace(pin, order=planned.order, learning_arm=learning)
            if not preview:
                pin = await self.store.pin(pin, rollout_id=view.rollout_id, tenant=tenant, caps=self.caps)
        elif not pin.order:  # pinned before pins held orders: the order is a function of version and nodes
            pin = dataclasses.replace(pin, order=planned.order)
        if pin.order != planned.order:  # the pin stands (made by an earlier planner): predict it as it is
            planned = pinned_order(rank_map, pin.order, version=pin.version)
        address = await self._address(pin.order[0])
        return ResolvedJob(
            pin, tuple(sorted(files)), view.rollout_id, planned, address, timing_sample=self.learning.timing_sample
        )

    async def _learning_arm(self, pin: JobPin, files: Mapping[str, str], *, may_learn: bool) -> ArmIndex | None:
        """The arm a new pin carries (``learning.assignment``), or None when the job does not learn: an arm of
        ``exec --compare`` (it names its version), NCCL's defaults or a version without challengers, a caller
        that cannot ship timing records or a job that opted out, the cluster's switch off, the version's kill
        switch set."""
        challengers = challenger_count(files)
        if pin.arm or not pin.version or not challengers or not may_learn or not self.learning.enabled:
            return None
        switches = LearningSwitches(
            cluster_enabled=True, version_stopped=await self.store.versions.learning_stopped(pin.version)
        )
        if switches.version_stopped:
            return None
        exploration = Exploration(pin.version, challengers, self.learning.explore_share)
        return assign_arm(exploration, pin.job_id, switches=switches, job_env={})

    async def _address(self, node: str) -> str:
        if self.registry is None:
            return node
        try:
            found = await self.registry.get(NodeName(node))
        except NotFoundError:
            return node
        return found.address or node
