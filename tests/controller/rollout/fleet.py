"""A simulated fleet for rollout tests: agents played at the command-book level, and a seeded A/B verifier.

``SimFleet`` does what agents do with ApplyConfig (execute each command id at most once, report the active
version in a heartbeat) without gRPC, so crash tests can restart the controller's objects hundreds of times.
``SimVerifier`` produces interleaved A/B samples from a seeded model: the new version is ``gain`` faster,
except on racks listed in ``regressed_racks``, where it is ``regression`` slower.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from topo_tune.controller.commands import CommandBook
from topo_tune.controller.db.database import Database
from topo_tune.controller.metrics import ControllerMetrics
from topo_tune.controller.nodes import NodeRegistry, Registration
from topo_tune.controller.rollout.engine import RolloutEngine, Verifier
from topo_tune.controller.rollout.gate_run import GateRun
from topo_tune.controller.rollout.gates import Sample
from topo_tune.controller.rollout.store import RolloutStore
from topo_tune.controller.sessions import SessionHub
from topo_tune.nccl.backends import Backend
from topo_tune.v1 import agent_pb2
from topo_tune.versions.version import ConfigVersion, render_nccl_conf

V1 = ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_MIN_CTAS": "8"})})
V2 = ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_MIN_CTAS": "16", "NCCL_NTHREADS": "256"})})
V3 = ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_MIN_CTAS": "32"})})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class SimVerifier:
    rack_of: dict[str, str]
    regressed_racks: frozenset[str] = frozenset()
    slow_racks: frozenset[str] = frozenset()
    """Racks whose links carry half the bandwidth: both arms slow alike, so the A/B alone sees nothing."""
    gain: float = 0.08
    regression: float = 0.10
    pairs: int = 10
    calls: list[tuple[int, int]] = field(default_factory=list)

    async def verify(self, run: GateRun) -> Sequence[Sample]:
        self.calls.append((run.wave, run.attempt))
        rng = random.Random(f"{run.rollout_id}/{run.wave}/{run.attempt}")
        bad = any(self.rack_of[n] in self.regressed_racks for n in run.nodes)
        factor = 1 + self.regression if bad else 1 - self.gain
        slow = 2.0 if any(self.rack_of[n] in self.slow_racks for n in run.nodes) else 1.0
        samples = []
        for repeat in range(self.pairs):
            base = 100 * slow * (1 + rng.gauss(0, 0.02))
            samples.append(Sample(repeat, "previous", base * (1 + rng.gauss(0, 0.004)), 2 * base, 40.0 / slow))
            new_time = base * factor * (1 + rng.gauss(0, 0.004))
            busbw = 40 / factor / slow * (1 + rng.gauss(0, 0.01))
            samples.append(Sample(repeat, "new", new_time, 2 * base * factor, busbw))
        return samples


@dataclass
class SimFleet:
    """The agents: node → active version, and every command id each has executed."""

    rack_of: dict[str, str]
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """node → the labels it registers with (e.g. the network tiers above its rack)."""
    active: dict[str, str] = field(default_factory=dict)
    executed: dict[str, list[str]] = field(default_factory=dict)
    """node → versions applied, in order (one entry per executed command)."""
    done: dict[str, agent_pb2.CommandResult] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    busy: dict[str, int] = field(default_factory=dict)
    """node → how many more ApplyConfig commands it refuses (a job holds the node)."""

    async def register_all(self, registry: NodeRegistry) -> None:
        for node, rack in self.rack_of.items():
            await registry.register(
                Registration(
                    node_name=node,
                    rack=rack,
                    labels=self.labels.get(node, {}),
                    topology=b"",
                    agent_version="test",
                    backend=Backend.SIM,
                    instance_id="i",
                    applied_config_version=self.active.get(node, ""),
                    drained=False,
                )
            )

    async def tick(self, registry: NodeRegistry, commands: CommandBook, only: Iterable[str] | None = None) -> None:
        """Every reachable agent (of ``only``) runs its outstanding commands (at most once per id) and heartbeats."""
        for node in self.rack_of if only is None else only:
            if node in self.lost:
                continue
            for record in await commands.outstanding(node):
                result = self.done.get(record.id)
                if result is None and self.busy.get(node, 0) > 0:
                    self.busy[node] -= 1
                    result = agent_pb2.CommandResult(
                        command_id=record.id,
                        status=agent_pb2.COMMAND_STATUS_FAILED,
                        message="not changing the config now: a job on this node holds it",
                    )
                    self.done[record.id] = result
                if result is None:
                    body = record.body.apply_config
                    if self.active.get(node, "") != body.version:
                        self.active[node] = body.version
                        self.executed.setdefault(node, []).append(body.version)
                    result = agent_pb2.CommandResult(
                        command_id=record.id, status=agent_pb2.COMMAND_STATUS_SUCCEEDED, message="ok"
                    )
                    self.done[record.id] = result
                await commands.finish(node, result)
            if registry.heartbeat(node, activity="idle", applied_config_version=self.active.get(node, "")):
                await registry.mark_ready(node)


@dataclass
class ControllerParts:
    """The controller objects a rollout needs, built fresh as a restarted controller would."""

    db: Database
    registry: NodeRegistry
    commands: CommandBook
    engine: RolloutEngine

    @classmethod
    async def start(cls, url: str, clock: Clock, verifier: Verifier, *, migrate: bool = True) -> ControllerParts:
        db = Database(url, retry_for_s=1)
        if migrate:
            db.migrate()
        registry = NodeRegistry(db=db, expiry_s=30, clock=clock.monotonic, wall_clock=clock.wall)
        await registry.load()
        commands = CommandBook(db=db, wall_clock=clock.wall)
        hub = SessionHub(
            registry=registry,
            commands=commands,
            metrics=ControllerMetrics(),
            heartbeat_interval_ms=1000,
            controller_id="test",
        )
        store = RolloutStore(db=db, wall_clock=clock.wall)
        engine = RolloutEngine(
            store=store, registry=registry, commands=commands, hub=hub, verifier=verifier, wall_clock=clock.wall
        )
        return cls(db, registry, commands, engine)

    def close(self) -> None:
        self.db.close()


def racks(count: int, per_rack: int) -> dict[str, str]:
    return {f"r{r}n{n}": f"rack-{r}" for r in range(1, count + 1) for n in range(1, per_rack + 1)}
