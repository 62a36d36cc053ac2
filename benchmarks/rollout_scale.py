"""Rollout overhead at scale: 1,000 simulated nodes in 125 racks, canary then rack by rack.

The controller side is real (SQLite database, node registry, command book, rollout store and engine); the
agents are simulated at the command-book level (they apply each ApplyConfig at once and heartbeat) and the
gates' A/B samples come from a seeded model that answers instantly, so what is timed is the controller's own
work: planning, committing every transition with its audit entries, sending commands, judging gates.

Usage: python benchmarks/rollout_scale.py [--racks 125] [--per-rack 8]
Target (Rollout issue): under 1 s of controller time per wave of 8 nodes and under 2 minutes in total.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from tests.controller.rollout.fleet import V1, Clock, ControllerParts, SimFleet, SimVerifier, racks
from topo_tune.config.cluster import RolloutThresholdsConfig
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.controller.rollout.state import RolloutPhase, desired_versions


async def run(rack_count: int, per_rack: int, directory: Path) -> None:
    clock = Clock()
    rack_of = racks(rack_count, per_rack)
    fleet = SimFleet(rack_of)
    parts = await ControllerParts.start(f"sqlite:///{directory / 'bench.db'}", clock, SimVerifier(rack_of))
    await fleet.register_all(parts.registry)
    started = time.perf_counter()
    created = await parts.engine.create(V1, policy=PlanPolicy(), thresholds=RolloutThresholdsConfig(), actor="bench")
    create_s = time.perf_counter() - started
    per_wave: dict[int, float] = {}
    controller_s = create_s
    while True:
        before = time.perf_counter()
        snapshot = await parts.engine.reconcile()
        spent = time.perf_counter() - before
        controller_s += spent
        if snapshot is None:
            break
        per_wave[snapshot.rollout.wave] = per_wave.get(snapshot.rollout.wave, 0.0) + spent
        await fleet.tick(parts.registry, parts.commands, only=desired_versions(snapshot))
        clock.advance(1)
    final = await parts.engine.store.load(created.rollout.id)
    parts.close()
    assert final.rollout.phase is RolloutPhase.COMPLETED, final.rollout
    waves = [per_wave[i] for i in sorted(per_wave) if i < len(final.waves)]
    header = ("nodes", 6), ("racks", 6), ("waves", 6), ("plan+create s", 14), ("wave p50 s", 11), ("wave max s", 11)
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'total s':>8}")
    print(
        f"{len(rack_of):>6} {rack_count:>6} {len(final.waves):>6} {create_s:>14.3f} "
        f"{statistics.median(waves):>11.3f} {max(waves):>11.3f} {controller_s:>8.1f}"
    )
    print("target: wave < 1 s, total < 120 s (controller time; simulated agents and gates excluded)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, default=125)
    parser.add_argument("--per-rack", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(run(args.racks, args.per_rack, Path(directory)))


if __name__ == "__main__":
    main()
