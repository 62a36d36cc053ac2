"""The controller's services, built once, in dependency order, each from its constructor's arguments.

Nothing is changed on a service after it is built: listeners, the idleness check and the agent-token
reviewer are constructor arguments. Where two services need each other (the session hub tells benchmark
jobs and probes about results, and they send their commands through the hub; the node registry tells the
drift checker about changed topologies), the earlier one is given a method of ``Services`` that calls the
later one. Non-goals: starting anything (``server.py``), leadership (``leadership.py``), the periodic jobs
(``schedule.py``) and the gRPC servers (``serving.py``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from topo_tune.controller.api.in_process import InProcessPort
from topo_tune.controller.benchmarks.service import BenchmarkJobs, JobSettings
from topo_tune.controller.changes import Changes
from topo_tune.controller.commands import CommandBook
from topo_tune.controller.config_versions import stop_learning_in
from topo_tune.controller.credential_ledger import CredentialLedger
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.db.database import Database
from topo_tune.controller.drift import DriftChecker
from topo_tune.controller.job_comparisons import JobComparisons
from topo_tune.controller.job_timings import JobTimings
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.nodes import NodeRegistry, TopologyChange
from topo_tune.controller.probes import Probes
from topo_tune.controller.retention import Retention
from topo_tune.controller.rollout.engine import RolloutEngine
from topo_tune.controller.rollout.job_pins import JobNodesLookup, JobResolver
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.controller.rollout.verification import BenchmarkVerifier, wave_order
from topo_tune.controller.sessions import SessionHub
from topo_tune.controller.settings import ControllerSettings
from topo_tune.controller.studies import Studies, StudyPass
from topo_tune.ids import ConfigVersionId, NodeName
from topo_tune.kube.idleness import NodeIdleness, busy_nodes
from topo_tune.plugin.table import parse_tuner_table
from topo_tune.v1 import agent_pb2
from topo_tune.versions.version import TUNER_TABLE

logger = logging.getLogger(__name__)


def wall_clock() -> datetime:
    return datetime.now(UTC)


class Services:
    """Every service of one controller process."""

    def __init__(
        self,
        settings: ControllerSettings,
        *,
        controller_id: str,
        db: Database,
        credentials: Credentials,
        idleness: NodeIdleness,
        leading: Callable[[], bool],
        job_nodes: JobNodesLookup | None = None,
        study_pass: StudyPass[InProcessPort] | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.credentials = credentials
        self.idleness = idleness
        """Asked before benchmark work goes to a node (Kubernetes: cordoned, or GPU pods on it)."""
        self._leading = leading
        self.metrics = ControllerMetrics()
        self._fleet(settings, controller_id=controller_id)
        self._measurements(settings)
        self._rollouts_and_studies(settings, study_pass)
        self.retention = Retention(db=db, wall_clock=wall_clock, settings=settings.retention, metrics=self.metrics)
        self.job_configs = JobResolver(
            self.rollout_store, self.registry, job_nodes=job_nodes, caps=settings.job_caps, learning=settings.learning
        )
        self.job_comparisons = JobComparisons(
            db=db,
            wall_clock=wall_clock,
            pins=lambda job_id, arm: self.rollout_store.get_pin(job_id, arm=arm),
            pin_owner=self.rollout_store.pin_owner,
            caps=settings.job_caps,
        )
        self.job_timings = JobTimings(
            db=db,
            wall_clock=wall_clock,
            pins=self.rollout_store.get_pin,
            pin_owner=self.rollout_store.pin_owner,
            stop_learning=stop_learning_in,
        )
        self.credential_ledger = CredentialLedger(db=db, credentials=credentials, hub=self.hub, wall_clock=wall_clock)

    def _fleet(self, settings: ControllerSettings, *, controller_id: str) -> None:
        """The nodes, the command book, the agents' sessions and the wake-ups every service listens to."""
        db = self.db
        self.registry = NodeRegistry(
            db=db,
            expiry_s=settings.heartbeat_expiry_s,
            clock=time.monotonic,
            wall_clock=wall_clock,
            rack_of=dict(settings.rack_of),
            topology_listeners=(self._on_topology_change,),
        )
        self.commands = CommandBook(
            db=db, wall_clock=wall_clock, ignored_results_kept=settings.retention.ignored_results_per_node
        )
        self.hub = SessionHub(
            registry=self.registry,
            commands=self.commands,
            metrics=self.metrics,
            heartbeat_interval_ms=int(settings.heartbeat_interval_s * 1000),
            controller_id=controller_id,
            fanout_window=settings.fanout_window,
            result_listeners=(self._on_result,),
        )
        self.changes = Changes()  # one set of wake-ups for jobs, probe rounds, drift checks, rollouts and studies

    def _measurements(self, settings: ControllerSettings) -> None:
        """Benchmark jobs and probe rounds on the nodes."""
        db = self.db
        self.jobs = BenchmarkJobs(
            db=db,
            registry=self.registry,
            commands=self.commands,
            deliver=self.hub.deliver_many,
            wall_clock=wall_clock,
            settings=JobSettings(
                spine_oversubscription=settings.spine_oversubscription,
                spine_ecmp_paths=settings.spine_ecmp_paths,
                result_grace_s=settings.benchmark_result_grace_s,
            ),
            busy_reasons=self._busy_reasons,
            changes=self.changes,
        )
        self.probes = Probes(
            db=db,
            registry=self.registry,
            commands=self.commands,
            deliver=self.hub.deliver_new,
            wall_clock=wall_clock,
            changes=self.changes,
        )

    def _rollouts_and_studies(self, settings: ControllerSettings, study_pass: StudyPass[InProcessPort] | None) -> None:
        """Config versions and rollouts, studies, and the drift checks of the stable version."""
        db = self.db
        self.rollout_store = RolloutStore(db=db, wall_clock=wall_clock)
        self.config_versions = self.rollout_store.versions
        spine = (settings.spine_oversubscription, settings.spine_bandwidth_gbps)
        self.studies: Studies[InProcessPort] = Studies(
            db=db,
            registry=self.registry,
            wall_clock=wall_clock,
            output_root=settings.studies_dir,
            open_port=functools.partial(
                InProcessPort,
                registry=self.registry,
                jobs=self.jobs,
                probes=self.probes,
                config_versions=self.config_versions,
                spine=spine,
            ),
            study_pass=study_pass,
            rack_of=dict(settings.rack_of),
            spine=spine,
            learning=settings.learning,
            changes=self.changes,
        )
        verifier = BenchmarkVerifier(
            jobs=self.jobs, config_dir=settings.agent_config_dir, tables=self._tuner_table, orders=self._wave_order
        )
        self.rollouts = RolloutEngine(
            store=self.rollout_store,
            registry=self.registry,
            commands=self.commands,
            hub=self.hub,
            verifier=verifier,
            wall_clock=wall_clock,
            background_gates=True,
            gate_defaults=settings.rollout_gate,
            threshold_defaults=settings.rollout_thresholds,
            changes=self.changes,
        )
        self.drift = DriftChecker(
            db=db,
            registry=self.registry,
            rollouts=self.rollout_store,
            verifier=verifier,
            studies=self.studies,
            metrics=self.metrics,
            wall_clock=wall_clock,
            settings=settings.drift,
            idle=self._idle_nodes,
            changes=self.changes,
        )

    async def load(self) -> int:
        """Load what the database holds and end the work a previous controller process left running; returns how
        many nodes are known."""
        known = await self.registry.load()
        await self.credential_ledger.load()
        await self.probes.recover()
        await self.jobs.recover()
        await self.studies.recover()
        await self.drift.recover()
        return known

    async def _on_result(self, node_name: NodeName, result: agent_pb2.CommandResult, job_id: str | None) -> None:
        await self.jobs.on_result(node_name, result, job_id)
        await self.probes.on_result(node_name, result, job_id)

    async def _tuner_table(self, version: ConfigVersionId) -> str:
        """``version``'s tuner-plugin table when it has rows, for its gate jobs; else ""."""
        table = (await self.config_versions.files(version)).get(TUNER_TABLE, "")
        return table if parse_tuner_table(table, source=f"{version}/{TUNER_TABLE}") else ""

    async def _wave_order(self, version: ConfigVersionId, nodes: Sequence[str]) -> tuple[str, ...]:
        """The rank order ``version``'s gate jobs run ``nodes`` in ("": NCCL's defaults, the launcher's order)."""
        return wave_order(await self.config_versions.files(version) if version else {}, nodes, version=version)

    async def _busy_reasons(self, nodes: list[str]) -> list[str]:
        return [f"{verdict.node_name}: {verdict.reason}" for verdict in await busy_nodes(self.idleness, nodes)]

    async def _idle_nodes(self, nodes: list[NodeName]) -> list[NodeName]:
        busy = {verdict.node_name for verdict in await busy_nodes(self.idleness, nodes)}
        return [n for n in nodes if n not in busy]

    async def _on_topology_change(self, change: TopologyChange) -> None:
        if not self._leading():
            return
        try:
            await self.drift.on_topology_change(
                change.node_name, before=change.before, after=change.after, version=change.applied_config_version
            )
        except Exception:
            # The registration itself is committed (with its event); the agent's session must not fail over this.
            logger.exception("recording a topology change failed", extra={"node": change.node_name})
