"""The rollout engine: reconciles the active rollout with what the fleet reports, one committed step at a time.

Each pass reads the committed snapshot, observes the nodes (reported version, liveness, whether a command
of this rollout is still open for them), asks ``state.reconcile`` for the next step and commits it; only
when there is no step to take does it act: send ``ApplyConfig`` to the nodes that still need a version, or
run the current wave's gate and store its verdict. Every action is idempotent: an ApplyConfig's command id
is derived from (rollout, node, version, attempt), so a controller that dies after sending and resumes sends
the same command (the command book returns the stored one, the agent executes it at most once); a gate
verdict is stored under (rollout, wave, attempt) and a stored verdict is never measured again, while a gate
that did not finish is simply run again. A wave is therefore never applied twice and no gate is skipped.
While no rollout is active, the engine holds every reachable node on the stable version (the last completed
rollout's), so nodes that join later, drift, or were left on an aborted rollout's version converge to what
every job is given.

The gate's measurements come from a :class:`Verifier` (the A/B verification benchmark on the wave's nodes,
measured as the rollout's ``policy.gate`` says); the verdict also compares the wave's bus bandwidth with a
reference, that of the first earlier wave of as many nodes that passed (``gates.py``).
The controller uses ``verification.BenchmarkVerifier`` (benchmark jobs through the controller's job book);
:class:`NoVerifier` gives no samples, so every gate is inconclusive and pauses for an operator. A gate whose
benchmark cannot run (its nodes are not idle, say) is inconclusive too, with the reason.

Non-goals: the transition rules (``state.py``), persistence (``store.py``), scheduling the passes (the
controller's job scheduler calls :meth:`RolloutEngine.reconcile`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from topo_tune.command_record import CommandStatus
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.changes import Changes
from topo_tune.controller.commands import CommandBook
from topo_tune.controller.nodes import NodeRegistry
from topo_tune.controller.rollout import state
from topo_tune.controller.rollout.gate_run import GateRun
from topo_tune.controller.rollout.gates import Outcome, Sample, judge
from topo_tune.controller.rollout.plan import PlanPolicy, RolloutPlan, build_plan
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.controller.sessions import SessionHub
from topo_tune.errors import ConflictError, NotFoundError, TopoTuneError
from topo_tune.ids import ConfigVersionId, NodeName, RolloutId
from topo_tune.kube.rack import tiers_above
from topo_tune.node_record import NodeState
from topo_tune.v1 import agent_pb2
from topo_tune.versions.version import ConfigVersion

logger = logging.getLogger(__name__)

_FAILED = (CommandStatus.FAILED, CommandStatus.REJECTED, CommandStatus.TIMED_OUT)


class Verifier(Protocol):
    async def verify(self, run: GateRun) -> Sequence[Sample]:
        """Interleaved A/B samples of ``run.new`` vs ``run.previous`` on ``run.nodes``, measured as
        ``run.measurement`` says."""


class NoVerifier:
    """No verification benchmark is available: no samples, so every gate pauses for a human."""

    async def verify(self, run: GateRun) -> Sequence[Sample]:
        return ()


_STABLE = RolloutId("stable")
"""What the stable version's re-applies count as in their command ids (never a rollout's id: ``ro-…``)."""


def command_id(*, rollout_id: RolloutId, node: NodeName, version: ConfigVersionId, attempt: int) -> str:
    digest = hashlib.sha256(f"{rollout_id}\0{node}\0{version}\0{attempt}".encode()).hexdigest()
    return f"ro-{digest[:40]}"


@dataclass
class RolloutEngine:
    store: RolloutStore
    registry: NodeRegistry
    commands: CommandBook
    hub: SessionHub
    verifier: Verifier
    wall_clock: Callable[[], datetime]
    max_attempts: int = 5
    """ApplyConfig attempts per node before the rollout pauses for a human."""
    retry_after_s: float = 30.0
    """Wait between a failed ApplyConfig (e.g. refused while a job runs on the node) and the next attempt."""
    max_steps_per_pass: int = 10_000
    background_gates: bool = False
    """Run gates as tasks of their own (the controller: a gate takes minutes, a scheduled pass must not)."""
    gate_defaults: RolloutGateConfig = field(default_factory=RolloutGateConfig)
    threshold_defaults: RolloutThresholdsConfig = field(default_factory=RolloutThresholdsConfig)
    """What a new rollout's gates measure and judge by when its request leaves them out (cluster.yaml's
    ``rollout`` section)."""
    changes: Changes = field(default_factory=Changes)
    """Woken where a rollout's step or gate verdict is committed (the admin API's watch)."""
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _gates_running: set[tuple[str, int, int]] = field(default_factory=set, init=False)
    _gate_tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    async def plan(self, policy: PlanPolicy) -> RolloutPlan:
        """The waves over the registered nodes, each placed by its rack and the network tiers above it that its
        registration's labels name (``kube.rack``)."""
        nodes = await self.registry.list()
        return build_plan({n.name: (*tiers_above(n.labels), n.rack) for n in nodes}, policy)

    async def create(
        self,
        version: ConfigVersion,
        *,
        policy: PlanPolicy,
        thresholds: RolloutThresholdsConfig,
        actor: str,
        rollout_id: RolloutId | None = None,
    ) -> state.Snapshot:
        """RolloutPlan a rollout of ``version`` over the registered nodes and store it ``pending``."""
        plan = await self.plan(policy)
        await self.store.versions.store(version)
        step = state.new_snapshot(
            rollout_id=rollout_id or RolloutId(f"ro-{uuid.uuid4().hex[:12]}"),
            config_version=version.id,
            previous_version=await self.store.stable_version(),
            plan=plan,
            policy=policy,
            thresholds=thresholds,
            created_by=actor,
        )
        snapshot = await self.store.create(step)
        logger.info("rollout created", extra={"rollout": snapshot.rollout.id, "version": version.id})
        return snapshot

    async def reconcile(self) -> state.Snapshot | None:
        """Drive the active rollout as far as it can go now; returns where it stands (None: no rollout).

        A gate's benchmarks run outside the engine's lock (they take minutes; operators' verbs must not
        wait for them), and only one pass runs a given gate at a time.
        """
        while True:
            async with self._lock:
                snapshot, gate = await self._advance()
            if snapshot is None or gate is None:
                return snapshot
            if not self.background_gates:
                await self._run_gate(snapshot, *gate)
                continue
            self._gates_running.add((snapshot.rollout.id, *gate))  # before the task starts: no second one
            task = asyncio.get_running_loop().create_task(self._gate_then_reconcile(snapshot, *gate))
            self._gate_tasks.add(task)
            task.add_done_callback(self._gate_done)
            return snapshot

    async def _gate_then_reconcile(self, snapshot: state.Snapshot, wave_index: int, attempt: int) -> None:
        await self._run_gate(snapshot, wave_index, attempt)
        await self.reconcile()  # act on the verdict now rather than at the next tick

    def _gate_done(self, task: asyncio.Task[None]) -> None:
        self._gate_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a gate run failed; the next pass runs it again: %r", task.exception())

    async def close(self) -> None:
        """Cancel gates still measuring (their verdicts were not stored; a restarted controller reruns them)."""
        for task in list(self._gate_tasks):
            task.cancel()
        await asyncio.gather(*self._gate_tasks, return_exceptions=True)

    async def _advance(self) -> tuple[state.Snapshot | None, tuple[int, int] | None]:
        """Commit steps and send commands until the rollout waits; returns the gate to run, if that is next."""
        snapshot = None
        for _ in range(self.max_steps_per_pass):
            snapshot = await self.store.active()
            if snapshot is None:
                await self._hold_stable()
                return None, None
            observed = await self._observe(snapshot)
            gate = state.pending_gate(snapshot)
            verdict = None
            if gate is not None:
                verdict = await self.store.gate(snapshot.rollout.id, wave=gate[0], attempt=gate[1])
            step = state.reconcile(snapshot, observed, verdict, self.wall_clock())
            if step is not None:
                await self._commit(snapshot, step)
                continue
            if await self._act(snapshot, observed):
                continue
            if gate is not None and verdict is None and (snapshot.rollout.id, *gate) not in self._gates_running:
                return snapshot, gate
            return snapshot, None
        return snapshot, None

    async def _commit(self, snapshot: state.Snapshot, step: state.Step) -> state.Snapshot:
        after = await self.store.commit(snapshot, step)
        self.changes.changed(snapshot.rollout.id)
        for entry in step.audit:
            if entry.subject == "rollout" or entry.subject.startswith("wave"):
                logger.info(
                    "%s: %s → %s %s",
                    entry.subject,
                    entry.before,
                    entry.after,
                    entry.message,
                    extra={"rollout": snapshot.rollout.id, "actor": entry.actor},
                )
        return after

    async def _observe(self, snapshot: state.Snapshot) -> dict[NodeName, state.Observed]:
        desired = state.desired_versions(snapshot)
        observed: dict[NodeName, state.Observed] = {}
        for name in snapshot.nodes:
            view = self.registry.live_report(name)
            if view is None:
                continue
            settled = True
            if name in desired:
                cid = command_id(
                    rollout_id=snapshot.rollout.id,
                    node=name,
                    version=desired[name],
                    attempt=snapshot.nodes[name].attempt,
                )
                try:
                    settled = (await self.commands.get(cid)).status.final
                except NotFoundError:
                    settled = True
            observed[name] = state.Observed(
                view.applied_config_version, lost=view.state is NodeState.LOST, settled=settled
            )
        return observed

    async def _act(self, snapshot: state.Snapshot, observed: Mapping[NodeName, state.Observed]) -> bool:
        """Send what is missing. True when something changed that needs another pass."""
        rollout = snapshot.rollout
        for node, version in state.desired_versions(snapshot).items():
            attempt = snapshot.nodes[node].attempt
            cid = command_id(rollout_id=rollout.id, node=node, version=version, attempt=attempt)
            try:
                record = await self.commands.get(cid)
            except NotFoundError:
                record = None
            if record is None:
                files = await self.store.versions.files(version) if version else {}
                command = agent_pb2.Command(apply_config=agent_pb2.ApplyConfig(version=version, files=files))
                record = await self.commands.submit(node, command, command_id=cid)
                await self.hub.deliver_new(record)
                logger.info("ApplyConfig %s sent", version or "defaults", extra={"rollout": rollout.id, "node": node})
            elif record.status in _FAILED:
                seen = observed.get(node)
                if seen is not None and seen.version == version:
                    continue  # e.g. a repeat refused as busy after the version did land: nothing to retry
                finished = record.finished_at or record.created_at
                if (self.wall_clock() - finished).total_seconds() < self.retry_after_s:
                    continue  # a busy node (a job, a benchmark) gets time before the next attempt
                if attempt >= self.max_attempts:
                    reason = f"node {node} refused {version or 'defaults'} {attempt} times: {record.message}"
                    await self._commit(snapshot, state.pause_for(snapshot, reason))
                else:
                    await self._commit(snapshot, state.retry_node(snapshot, node, record.message))
                return True
        return False

    async def _run_gate(self, snapshot: state.Snapshot, wave_index: int, attempt: int) -> None:
        """Measure the wave, judge it and store the verdict (the next pass acts on it)."""
        rollout = snapshot.rollout
        key = (rollout.id, wave_index, attempt)
        self._gates_running.add(key)
        try:
            wave = snapshot.waves[wave_index]
            failure = ""
            try:
                run = GateRun(
                    rollout_id=rollout.id,
                    wave=wave_index,
                    attempt=attempt,
                    nodes=wave.nodes,
                    new=rollout.config_version,
                    previous=rollout.previous_version,
                    measurement=rollout.policy.gate,
                )
                samples = await self.verifier.verify(run)
            except TopoTuneError as error:  # e.g. the wave's nodes are not idle: Argo's "error" is inconclusive
                samples, failure = (), f"the verification benchmark could not run: {error}"
            lost = [n for n in wave.nodes if self.registry.state_of(n) in (None, NodeState.LOST)]
            reference = await self._reference_busbw(snapshot, wave_index)
            repeats = 0 if failure or isinstance(self.verifier, NoVerifier) else rollout.policy.gate.repeats
            verdict = judge(samples, rollout.thresholds, repeats=repeats, lost_nodes=lost, reference_busbw=reference)
            if failure:
                verdict = dataclasses.replace(verdict, reasons=(failure, *verdict.reasons))
            await self.store.save_gate(rollout.id, wave=wave_index, attempt=attempt, verdict=verdict, samples=samples)
            self.changes.changed(rollout.id)
        finally:
            self._gates_running.discard(key)
        logger.info(
            "wave %d gate %s: %s",
            wave_index,
            verdict.outcome,
            "; ".join(verdict.reasons),
            extra={"rollout": rollout.id},
        )

    async def _reference_busbw(self, snapshot: state.Snapshot, wave_index: int) -> float:
        """The new version's bus bandwidth on the first earlier wave of as many nodes that passed its gate
        (0: none): what this wave should reach unless its own fabric is worse."""
        size = len(snapshot.waves[wave_index].nodes)
        for record in sorted(await self.store.gates(snapshot.rollout.id), key=lambda g: (g.wave, g.attempt)):
            earlier = record.wave < wave_index and len(snapshot.waves[record.wave].nodes) == size
            if earlier and record.verdict.outcome is Outcome.SUCCESSFUL and record.verdict.busbw_new > 0:
                return record.verdict.busbw_new
        return 0.0

    async def _hold_stable(self) -> None:
        """No rollout is active: every reachable node must run the stable version.

        This brings nodes that joined after the last rollout, nodes that drifted, nodes whose active version's
        files were changed (the agent reports ``config_damage``; applying the version again re-stages it), and
        the nodes of an aborted rollout to the version every job outside a rollout is given. Each node's
        attempts are numbered; an attempt that failed (a job holds the node) is retried after ``retry_after_s``,
        one that succeeded but did not stick (the node reported something else afterwards) is followed by the
        next.
        """
        stable = await self.store.stable_version()
        now = self.wall_clock()
        for name in sorted(self.registry.off_version(stable)):  # only the nodes to act on, not the whole fleet
            view = self.registry.live_report(name)
            if view is None or view.state is NodeState.LOST:
                continue  # gone while this pass awaited
            if view.applied_config_version == stable and not view.config_damage:
                continue  # caught up meanwhile
            attempt, record = 0, None
            while True:
                cid = command_id(rollout_id=_STABLE, node=name, version=stable, attempt=attempt + 1)
                try:
                    found = await self.commands.get(cid)
                except NotFoundError:
                    break
                attempt, record = attempt + 1, found
                if not found.status.final:
                    break
            if record is not None:
                finished = record.finished_at or record.created_at
                if not record.status.final:
                    continue  # on its way
                if record.status is CommandStatus.SUCCEEDED and view.last_seen_at <= finished:
                    continue  # applied; its report is on its way
                if record.status in _FAILED and (now - finished).total_seconds() < self.retry_after_s:
                    continue
            files = await self.store.versions.files(stable) if stable else {}
            command = agent_pb2.Command(apply_config=agent_pb2.ApplyConfig(version=stable, files=files))
            cid = command_id(rollout_id=_STABLE, node=name, version=stable, attempt=attempt + 1)
            await self.hub.deliver_new(await self.commands.submit(name, command, command_id=cid))
            logger.info(
                "node reports %s%s; sending the stable version %s",
                view.applied_config_version or "defaults",
                " (damaged)" if view.config_damage else "",
                stable or "defaults",
                extra={"node": name},
            )

    # -- the operator's verbs: each is one committed step ------------------------------------------------------

    async def _verb(self, rollout_id: RolloutId, make: Callable[[state.Snapshot], state.Step | None]) -> state.Snapshot:
        async with self._lock:
            snapshot = await self.store.load(rollout_id)
            step = make(snapshot)
            if step is not None:
                snapshot = await self._commit(snapshot, step)
        return snapshot

    async def pause(self, rollout_id: RolloutId, *, actor: str, reason: str = "") -> state.Snapshot:
        return await self._verb(rollout_id, lambda s: state.pause(s, actor=actor, reason=reason))

    async def resume(self, rollout_id: RolloutId, *, actor: str) -> state.Snapshot:
        return await self._verb(rollout_id, lambda s: state.resume(s, actor=actor))

    async def promote(self, rollout_id: RolloutId, *, actor: str) -> state.Snapshot:
        return await self._verb(rollout_id, lambda s: state.promote(s, actor=actor, now=self.wall_clock()))

    async def abort(self, rollout_id: RolloutId, *, actor: str, reason: str = "") -> state.Snapshot:
        return await self._verb(rollout_id, lambda s: state.abort(s, actor=actor, reason=reason))

    async def rollback(self, rollout_id: RolloutId, *, actor: str, reason: str = "") -> state.Snapshot:
        """Roll back (also a completed or aborted rollout), unless another rollout has started since."""

        def make(snapshot: state.Snapshot) -> state.Step | None:
            return state.rollback(snapshot, actor=actor, reason=reason)

        async with self._lock:
            active = await self.store.active()
            if active is not None and active.rollout.id != rollout_id:
                raise ConflictError(
                    f"rollout {active.rollout.id} is active; it must end before {rollout_id} rolls back"
                )
        return await self._verb(rollout_id, make)
