"""The rollout state machine, per rollout, per wave and per node: pure transitions with an audit trail.

A rollout moves ``pending → applying ⇄ verifying → … → completed``; a failed gate (or an operator) turns it
``rolling_back`` and it ends ``rolled_back``; an inconclusive gate, a lost node or an operator pauses it;
``aborted`` stops it where it is. Waves and nodes have their own phases (see the enums). Everything here is
a pure function of the persisted :class:`Snapshot`, what the fleet reports (:class:`Observed`), the gate's
verdict and the time: :func:`reconcile` returns the next :class:`Step` (the new snapshot and the audit
entries explaining it) or None when there is nothing to change. The engine commits each step before it acts
on it, and decides its actions (which node needs which version, which gate must run) from the committed
snapshot alone (:func:`desired_versions`, :func:`pending_gate`), so a controller restarted at any point
derives the same next step: level-triggered, never replaying an event.

The operator's verbs (:func:`pause`, :func:`resume`, :func:`promote`, :func:`abort`, :func:`rollback`) are
steps too. A rollback is idempotent (asking again while rolling back changes nothing) and resumable (it is
just a phase the reconcile loop drives, wave by wave in reverse order).

Non-goals: persistence (``store.py``), talking to agents or running benchmarks (``engine.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from topo_tune.config.cluster import RolloutThresholdsConfig
from topo_tune.controller.rollout.gates import GateVerdict, Outcome
from topo_tune.controller.rollout.plan import PlanPolicy, RolloutPlan, WaveKind
from topo_tune.errors import ConflictError
from topo_tune.ids import ConfigVersionId, NodeName, RolloutId


class RolloutPhase(StrEnum):
    PENDING = "pending"
    APPLYING = "applying"
    VERIFYING = "verifying"
    PAUSED = "paused"
    ROLLING_BACK = "rolling_back"
    COMPLETED = "completed"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"

    @property
    def final(self) -> bool:
        return self in (RolloutPhase.COMPLETED, RolloutPhase.ROLLED_BACK, RolloutPhase.ABORTED)


class WavePhase(StrEnum):
    PENDING = "pending"
    APPLYING = "applying"
    VERIFYING = "verifying"
    COMPLETED = "completed"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"


class NodePhase(StrEnum):
    PENDING = "pending"
    APPLYING = "applying"
    APPLIED = "applied"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"


_TOUCHED_WAVES = (WavePhase.APPLYING, WavePhase.VERIFYING, WavePhase.COMPLETED)
_TOUCHED_NODES = (NodePhase.APPLYING, NodePhase.APPLIED, NodePhase.ROLLING_BACK)

ENGINE = "engine"
TIMER = "timer"


@dataclass(frozen=True)
class Rollout:
    id: RolloutId
    config_version: ConfigVersionId
    previous_version: ConfigVersionId
    """What a rollback returns to: the stable version when the rollout was created ("" = NCCL defaults)."""
    phase: RolloutPhase
    policy: PlanPolicy
    thresholds: RolloutThresholdsConfig
    created_by: str
    wave: int = 0
    """The wave being applied or verified (after the last wave: the number of waves)."""
    gate_attempt: int = 1
    """Which run of the current wave's gate counts; a resume after an inconclusive gate runs it again."""
    reason: str = ""
    paused_from: RolloutPhase | None = None
    resume_at: datetime | None = None
    revision: int = 0
    """Bumped by every committed step; the store refuses a step made from a stale snapshot."""


@dataclass(frozen=True)
class WaveState:
    index: int
    kind: WaveKind
    racks: tuple[str, ...]
    nodes: tuple[NodeName, ...]
    phase: WavePhase = WavePhase.PENDING
    group: tuple[str, ...] = ()
    """The network tiers above the wave's racks (``plan.Wave.group``)."""


@dataclass(frozen=True)
class NodeRollout:
    wave: int
    phase: NodePhase = NodePhase.PENDING
    attempt: int = 1
    """Which ApplyConfig attempt counts; a failed command is retried under the next attempt number."""


@dataclass(frozen=True)
class Snapshot:
    rollout: Rollout
    waves: tuple[WaveState, ...]
    nodes: Mapping[NodeName, NodeRollout]

    @property
    def current_wave(self) -> WaveState | None:
        return self.waves[self.rollout.wave] if self.rollout.wave < len(self.waves) else None


@dataclass(frozen=True)
class Observed:
    """What the fleet says about one node right now."""

    version: ConfigVersionId
    lost: bool = False
    settled: bool = True
    """No command of this rollout is still open for the node: what it reports is where it will stay."""

    def reports(self, version: ConfigVersionId) -> bool:
        return self.version == version and not self.lost and self.settled


@dataclass(frozen=True)
class AuditEntry:
    subject: str
    """``rollout``, ``wave 2`` or ``node r1-n3``."""
    before: str
    after: str
    actor: str
    message: str = ""


@dataclass(frozen=True)
class Step:
    snapshot: Snapshot
    audit: tuple[AuditEntry, ...] = field(default_factory=tuple)


def new_snapshot(
    *,
    rollout_id: RolloutId,
    config_version: ConfigVersionId,
    previous_version: ConfigVersionId,
    plan: RolloutPlan,
    policy: PlanPolicy,
    thresholds: RolloutThresholdsConfig,
    created_by: str,
) -> Step:
    if config_version == previous_version:
        raise ConflictError(f"{config_version or 'NCCL defaults'} is already the stable version; nothing to roll out")
    rollout = Rollout(
        id=rollout_id,
        config_version=config_version,
        previous_version=previous_version,
        phase=RolloutPhase.PENDING,
        policy=policy,
        thresholds=thresholds,
        created_by=created_by,
    )
    # The plan names nodes as cluster.yaml and the registry do; here they become node names.
    waves = tuple(
        WaveState(w.index, w.kind, w.racks, tuple(NodeName(n) for n in w.nodes), group=w.group) for w in plan.waves
    )
    nodes = {node: NodeRollout(wave.index) for wave in waves for node in wave.nodes}
    message = f"{previous_version or 'defaults'} → {config_version}"
    if plan.skipped:  # kept in the history: the plan's waves do not name what they leave out
        message += "; " + "; ".join(f"skipped {node}: {why}" for node, why in plan.skipped[:20])
        message += f" (and {len(plan.skipped) - 20} more)" if len(plan.skipped) > 20 else ""
    entry = AuditEntry("rollout", "", RolloutPhase.PENDING, created_by, message)
    return Step(Snapshot(rollout, waves, nodes), (entry,))


class _Builder:
    """Collects the changes of one step and the audit entries that explain them."""

    def __init__(self, snapshot: Snapshot, actor: str) -> None:
        self.rollout = snapshot.rollout
        self.waves = list(snapshot.waves)
        self.nodes = dict(snapshot.nodes)
        self.actor = actor
        self.audit: list[AuditEntry] = []

    def set_rollout(self, message: str = "", **changes: object) -> None:
        before = self.rollout.phase
        self.rollout = dataclasses.replace(self.rollout, **changes)  # type: ignore[arg-type]
        if self.rollout.phase != before or message:
            self.audit.append(AuditEntry("rollout", before, self.rollout.phase, self.actor, message))

    def set_wave(self, index: int, phase: WavePhase, message: str = "") -> None:
        before = self.waves[index].phase
        self.waves[index] = dataclasses.replace(self.waves[index], phase=phase)
        self.audit.append(AuditEntry(f"wave {index}", before, phase, self.actor, message))

    def set_node(self, name: NodeName, message: str = "", **changes: object) -> None:
        before = self.nodes[name]
        self.nodes[name] = dataclasses.replace(before, **changes)  # type: ignore[arg-type]
        self.audit.append(AuditEntry(f"node {name}", before.phase, self.nodes[name].phase, self.actor, message))

    def step(self) -> Step | None:
        if not self.audit:
            return None
        rollout = dataclasses.replace(self.rollout, revision=self.rollout.revision + 1)
        return Step(Snapshot(rollout, tuple(self.waves), self.nodes), tuple(self.audit))


def reconcile(
    snapshot: Snapshot, observed: Mapping[NodeName, Observed], verdict: GateVerdict | None, now: datetime
) -> Step | None:
    """The next step the rollout takes on its own, or None when it waits (for agents, a gate or a human)."""
    rollout = snapshot.rollout
    b = _Builder(snapshot, ENGINE)
    if rollout.phase is RolloutPhase.PENDING:
        b.set_rollout("started", phase=RolloutPhase.APPLYING, wave=0)
    elif rollout.phase is RolloutPhase.PAUSED:
        if rollout.resume_at is not None and now >= rollout.resume_at:
            b.actor = TIMER
            b.set_rollout("pause between waves over", phase=RolloutPhase.APPLYING, paused_from=None, resume_at=None)
    elif rollout.phase is RolloutPhase.APPLYING:
        _applying(b, snapshot, observed)
    elif rollout.phase is RolloutPhase.VERIFYING:
        if verdict is not None:
            _judged(b, snapshot, verdict, now)
    elif rollout.phase is RolloutPhase.ROLLING_BACK:
        _rolling_back(b, snapshot, observed)
    return b.step()


def _lost(nodes: Iterable[NodeName], observed: Mapping[NodeName, Observed]) -> list[NodeName]:
    return [n for n in nodes if n not in observed or observed[n].lost]


def _applying(b: _Builder, snapshot: Snapshot, observed: Mapping[NodeName, Observed]) -> None:
    wave = snapshot.current_wave
    rollout = snapshot.rollout
    if wave is None:
        b.set_rollout("every wave passed its gate", phase=RolloutPhase.COMPLETED)
        return
    if wave.phase is WavePhase.PENDING:
        b.set_wave(wave.index, WavePhase.APPLYING, f"racks {', '.join(wave.racks) or '-'}")
        for node in wave.nodes:
            b.set_node(node, f"→ {rollout.config_version}", phase=NodePhase.APPLYING)
        return
    for node in wave.nodes:
        state, seen = snapshot.nodes[node], observed.get(node)
        if seen is None or seen.lost:
            continue
        if state.phase is NodePhase.APPLYING and seen.reports(rollout.config_version):
            b.set_node(node, "reports the new version", phase=NodePhase.APPLIED)
        elif state.phase is NodePhase.APPLIED and seen.version != rollout.config_version:
            b.set_node(node, f"now reports {seen.version or 'defaults'}", phase=NodePhase.APPLYING)
    if all(b.nodes[n].phase is NodePhase.APPLIED for n in wave.nodes):
        b.set_wave(wave.index, WavePhase.VERIFYING)
        b.set_rollout(phase=RolloutPhase.VERIFYING, gate_attempt=1)
        return
    if b.audit:
        return
    lost = _lost(wave.nodes, observed)
    if lost:
        b.set_rollout(
            f"lost nodes in wave {wave.index}: {', '.join(lost)}",
            phase=RolloutPhase.PAUSED,
            paused_from=RolloutPhase.APPLYING,
            reason=f"lost nodes: {', '.join(lost)}",
        )


def _judged(b: _Builder, snapshot: Snapshot, verdict: GateVerdict, now: datetime) -> None:
    rollout = snapshot.rollout
    wave = snapshot.waves[rollout.wave]
    summary = "; ".join(verdict.reasons)
    if verdict.outcome is Outcome.FAILED:
        _start_rollback(b, f"wave {wave.index} gate failed: {summary}")
    elif verdict.outcome is Outcome.INCONCLUSIVE:
        b.set_rollout(
            f"wave {wave.index} gate inconclusive: {summary}",
            phase=RolloutPhase.PAUSED,
            paused_from=RolloutPhase.VERIFYING,
            reason=f"gate inconclusive: {summary}",
        )
    else:
        b.set_wave(wave.index, WavePhase.COMPLETED, f"gate passed: {summary}")
        _next_wave(b, snapshot, now)


def _next_wave(b: _Builder, snapshot: Snapshot, now: datetime) -> None:
    rollout, policy = snapshot.rollout, snapshot.rollout.policy
    following = rollout.wave + 1
    if following >= len(snapshot.waves):
        b.set_rollout("every wave passed its gate", phase=RolloutPhase.COMPLETED, wave=following, reason="")
    elif policy.require_approval:
        b.set_rollout(
            f"wave {following} waits for approval",
            phase=RolloutPhase.PAUSED,
            wave=following,
            paused_from=RolloutPhase.APPLYING,
            reason="waiting for approval (promote to continue)",
        )
    elif policy.pause_between_s > 0:
        b.set_rollout(
            f"pausing {policy.pause_between_s:g} s before wave {following}",
            phase=RolloutPhase.PAUSED,
            wave=following,
            paused_from=RolloutPhase.APPLYING,
            resume_at=now + timedelta(seconds=policy.pause_between_s),
            reason="pause between waves",
        )
    else:
        b.set_rollout(phase=RolloutPhase.APPLYING, wave=following, reason="")


def _start_rollback(b: _Builder, reason: str) -> None:
    b.set_rollout(reason, phase=RolloutPhase.ROLLING_BACK, reason=reason, paused_from=None, resume_at=None)


def _rolling_back(b: _Builder, snapshot: Snapshot, observed: Mapping[NodeName, Observed]) -> None:
    rollout = snapshot.rollout
    current = next((w for w in reversed(snapshot.waves) if w.phase is WavePhase.ROLLING_BACK), None)
    if current is None:
        touched = next((w for w in reversed(snapshot.waves) if w.phase in _TOUCHED_WAVES), None)
        if touched is None:
            b.set_rollout(f"back on {rollout.previous_version or 'defaults'}", phase=RolloutPhase.ROLLED_BACK)
            return
        b.set_wave(touched.index, WavePhase.ROLLING_BACK, f"→ {rollout.previous_version or 'defaults'}")
        for node in touched.nodes:
            if snapshot.nodes[node].phase in _TOUCHED_NODES:
                b.set_node(node, f"→ {rollout.previous_version or 'defaults'}", phase=NodePhase.ROLLING_BACK)
        return
    for node in current.nodes:
        seen = observed.get(node)
        if (
            snapshot.nodes[node].phase is NodePhase.ROLLING_BACK
            and seen is not None
            and seen.reports(rollout.previous_version)
        ):
            b.set_node(node, "reports the previous version", phase=NodePhase.ROLLED_BACK)
    if all(b.nodes[n].phase in (NodePhase.ROLLED_BACK, NodePhase.PENDING) for n in current.nodes):
        b.set_wave(current.index, WavePhase.ROLLED_BACK)


# -- what the engine must do for the committed snapshot --------------------------------------------------------


def desired_versions(snapshot: Snapshot) -> dict[NodeName, ConfigVersionId]:
    """Node → the version it must be sent now (only nodes the rollout is changing)."""
    rollout = snapshot.rollout
    if rollout.phase is RolloutPhase.APPLYING:
        return {n: rollout.config_version for n, s in snapshot.nodes.items() if s.phase is NodePhase.APPLYING}
    if rollout.phase is RolloutPhase.ROLLING_BACK:
        return {n: rollout.previous_version for n, s in snapshot.nodes.items() if s.phase is NodePhase.ROLLING_BACK}
    return {}


def pending_gate(snapshot: Snapshot) -> tuple[int, int] | None:
    """``(wave, attempt)`` of the gate that must run now, if any."""
    rollout = snapshot.rollout
    if rollout.phase is RolloutPhase.VERIFYING:
        return rollout.wave, rollout.gate_attempt
    return None


def retry_node(snapshot: Snapshot, node: NodeName, why: str) -> Step:
    """The node's last ApplyConfig failed: the next one goes out under a new attempt number."""
    b = _Builder(snapshot, ENGINE)
    b.set_node(node, f"attempt {snapshot.nodes[node].attempt} failed: {why}", attempt=snapshot.nodes[node].attempt + 1)
    step = b.step()
    assert step is not None
    return step


def pause_for(snapshot: Snapshot, reason: str) -> Step:
    """The engine cannot go on by itself (e.g. a node keeps refusing the version): wait for a human."""
    b = _Builder(snapshot, ENGINE)
    b.set_rollout(reason, phase=RolloutPhase.PAUSED, paused_from=snapshot.rollout.phase, reason=reason)
    step = b.step()
    assert step is not None
    return step


# -- the operator's verbs -------------------------------------------------------------------------------------


def pause(snapshot: Snapshot, *, actor: str, reason: str = "") -> Step | None:
    rollout = snapshot.rollout
    if rollout.phase is RolloutPhase.PAUSED:
        return None
    if rollout.phase not in (RolloutPhase.PENDING, RolloutPhase.APPLYING, RolloutPhase.VERIFYING):
        raise ConflictError(f"rollout {rollout.id} is {rollout.phase}; only a running rollout can be paused")
    b = _Builder(snapshot, actor)
    paused_from = RolloutPhase.APPLYING if rollout.phase is RolloutPhase.PENDING else rollout.phase
    b.set_rollout(reason or "paused", phase=RolloutPhase.PAUSED, paused_from=paused_from, reason=reason or "paused")
    return b.step()


def resume(snapshot: Snapshot, *, actor: str) -> Step:
    """Continue a paused rollout; after an inconclusive gate the gate runs again."""
    rollout = snapshot.rollout
    if rollout.phase is not RolloutPhase.PAUSED:
        raise ConflictError(f"rollout {rollout.id} is {rollout.phase}, not paused")
    b = _Builder(snapshot, actor)
    into = rollout.paused_from or RolloutPhase.APPLYING
    attempt = rollout.gate_attempt + 1 if into is RolloutPhase.VERIFYING else rollout.gate_attempt
    b.set_rollout("resumed", phase=into, paused_from=None, resume_at=None, reason="", gate_attempt=attempt)
    step = b.step()
    assert step is not None
    return step


def promote(snapshot: Snapshot, *, actor: str, now: datetime) -> Step:
    """Skip a pause: accept the wave under verification as passed, or start the waiting wave now."""
    rollout = snapshot.rollout
    if rollout.phase is not RolloutPhase.PAUSED:
        raise ConflictError(f"rollout {rollout.id} is {rollout.phase}; only a paused rollout can be promoted")
    b = _Builder(snapshot, actor)
    if rollout.paused_from is RolloutPhase.VERIFYING:
        b.set_wave(rollout.wave, WavePhase.COMPLETED, f"promoted by {actor} ({rollout.reason})")
        b.set_rollout(paused_from=None, reason="")
        _next_wave(b, dataclasses.replace(snapshot, rollout=b.rollout), now)
    elif snapshot.current_wave is not None and snapshot.current_wave.phase is WavePhase.PENDING:
        b.set_rollout(f"promoted by {actor}", phase=RolloutPhase.APPLYING, paused_from=None, resume_at=None, reason="")
    else:
        raise ConflictError(f"rollout {rollout.id}: nothing to promote while wave {rollout.wave} is still applying")
    step = b.step()
    assert step is not None
    return step


def abort(snapshot: Snapshot, *, actor: str, reason: str = "") -> Step | None:
    """Stop the rollout where it is. Its waves are not rolled back in order; once no rollout is active the
    engine returns every node to the stable version (Argo's abort: back to stable)."""
    rollout = snapshot.rollout
    if rollout.phase is RolloutPhase.ABORTED:
        return None
    if rollout.phase.final:
        raise ConflictError(f"rollout {rollout.id} already ended {rollout.phase}")
    b = _Builder(snapshot, actor)
    b.set_rollout(reason or "aborted", phase=RolloutPhase.ABORTED, reason=reason or f"aborted by {actor}")
    return b.step()


def rollback(snapshot: Snapshot, *, actor: str, reason: str = "") -> Step | None:
    """Return every touched wave to the previous version, last wave first. Asking twice changes nothing."""
    rollout = snapshot.rollout
    if rollout.phase in (RolloutPhase.ROLLING_BACK, RolloutPhase.ROLLED_BACK):
        return None
    b = _Builder(snapshot, actor)
    _start_rollback(b, reason or f"rollback requested by {actor}")
    return b.step()
