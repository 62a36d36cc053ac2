"""A rollout as the admin API shows it and a client asks for one: one domain type for both sides of the wire.

The admin client takes a ``RolloutRequest`` and an operator's ``RolloutAction``, and answers with ``RolloutInfo``
(its waves, gates and where it stands) and ``RolloutTransition`` (its history); the CLI reads these, never the
messages. Non-goals: running a rollout and its state machine (``controller/rollout/``), the wire form
(``wire/rollouts.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from topo_tune.ids import NO_CONFIG_VERSION, NO_ROLLOUT, ConfigVersionId, RolloutId

ROLLOUT_ENDS = frozenset({"completed", "rolled_back", "aborted"})
"""The phases a rollout ends in."""


class RolloutAction(StrEnum):
    """An operator's verb on a rollout (Argo Rollouts' verbs)."""

    PAUSE = "pause"
    RESUME = "resume"
    """A paused gate runs again."""
    PROMOTE = "promote"
    """Accept the paused wave's gate, or start the waiting wave."""
    ABORT = "abort"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class GateMeasurement:
    """What each gate of a rollout measures: A/B repeats of all_reduce over a sweep of sizes.

    In a request, 0 (and ``cuda_graph`` None) keeps the controller's default (cluster.yaml's ``rollout.gate``).
    """

    repeats: int = 0
    min_bytes: int = 0
    max_bytes: int = 0
    step_factor: int = 0
    iters: int = 0
    warmup_iters: int = 0
    cuda_graph: bool | None = None
    """Time each size as CUDA graphs (nccl-tests -G) or as eager calls."""

    def overrides(self) -> dict[str, int | bool]:
        """What a request sets over the controller's defaults: each non-zero number, ``cuda_graph`` unless None."""
        given: dict[str, int | bool] = {
            name: value for name, value in dataclasses.asdict(self).items() if name != "cuda_graph" and value
        }
        if self.cuda_graph is not None:
            given["cuda_graph"] = self.cuda_graph
        return given


@dataclass(frozen=True)
class RolloutRequest:
    """What ``admin rollout create`` asks for: a version (its id, or its files) and the policy to roll it out by."""

    config_version: ConfigVersionId = NO_CONFIG_VERSION
    """Must be the hash of ``files`` when both are given."""
    files: Mapping[str, str] = field(default_factory=dict)
    """The version's files (nccl.conf, ...); empty: a version the controller has."""
    canary_nodes: int = 0
    """0: the controller's default (one node); ``no_canary`` asks for none."""
    canary_rack: str = ""
    """A whole rack as the canary wave, instead of ``canary_nodes``."""
    no_canary: bool = False
    max_parallel_racks: int = 0
    """0: one."""
    pause_between_s: float = 0.0
    require_approval: bool = False
    thresholds: Mapping[str, float] = field(default_factory=dict)
    """Over cluster.yaml's ``rollout.thresholds``: min_gain, alpha, max_regression, max_p99_regression, max_cv."""
    gate: GateMeasurement = field(default_factory=GateMeasurement)
    rollout_id: RolloutId = NO_ROLLOUT
    """Empty: the controller picks one."""
    actor: str = ""
    """Who asks, for the history."""
    dry_run: bool = False
    """Plan only: nothing is stored."""


@dataclass(frozen=True)
class RolloutWave:
    index: int
    kind: str
    """canary, racks"""
    racks: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    phase: str = ""
    """Empty in a plan."""


@dataclass(frozen=True)
class GateResult:
    """One attempt of a wave's gate: its outcome and the figures it was judged by."""

    wave: int
    attempt: int
    outcome: str
    """successful, failed, inconclusive"""
    reasons: tuple[str, ...] = ()
    time_change: float = 0.0
    p_gain: float = 0.0
    p99_change: float = 0.0
    cv_new: float = 0.0
    pairs: int = 0
    measured_at: datetime | None = None
    busbw_gbps: float = 0.0
    """The new version's bus bandwidth at the largest size (geometric mean)."""
    reference_busbw_gbps: float = 0.0
    """What it was compared with (an earlier wave's; 0: none)."""
    busbw_drop: float = 0.0
    """1 - busbw / reference."""


@dataclass(frozen=True)
class RolloutInfo:
    """A rollout where it stands, or a dry run's plan; a listed one has no waves, gates nor ``gate``."""

    id: RolloutId
    config_version: ConfigVersionId
    previous_version: ConfigVersionId = NO_CONFIG_VERSION
    """What a rollback returns to ("" = NCCL's defaults)."""
    phase: str = ""
    """pending, applying, verifying, paused, rolling_back, completed, rolled_back, aborted; planned (a dry run)"""
    wave: int = 0
    reason: str = ""
    created_by: str = ""
    waves: tuple[RolloutWave, ...] = ()
    gates: tuple[GateResult, ...] = ()
    """Every attempt, in order: the last one of a wave is its verdict."""
    plan: str = ""
    """The plan rendered as a table."""
    node_phases: Mapping[str, str] = field(default_factory=dict)
    dry_run: bool = False
    gate: GateMeasurement | None = None
    """What its gates measure."""
    thresholds: Mapping[str, float] = field(default_factory=dict)
    """What its gates judge by."""
    resume_at: datetime | None = None
    """Paused: when the timed pause between waves ends; None: it waits for an operator."""
    node_errors: Mapping[str, str] = field(default_factory=dict)
    """Node → why its last finished config apply failed (absent: it did not)."""

    @property
    def ended(self) -> bool:
        return self.phase in ROLLOUT_ENDS

    @property
    def waits_for_operator(self) -> bool:
        """Paused until someone resumes, promotes, aborts or rolls it back (a timed pause between waves is not)."""
        return self.phase == "paused" and self.resume_at is None


@dataclass(frozen=True)
class RolloutTransition:
    """One entry of a rollout's history: what changed, from what to what, and who or what caused it."""

    at: datetime
    subject: str
    """rollout, wave N, node NAME"""
    before: str
    after: str
    actor: str
    message: str
