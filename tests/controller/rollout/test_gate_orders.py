"""Gates measure the order: each arm's benchmark jobs run in its version's node order, over sim agents.

Four ``sim`` nodes in two racks behind an oversubscribed spine; their names alternate between the racks, so
the launcher's order (sorted names) crosses the spine on every ring hop. Both versions below hold the same
settings and differ only in their rank maps, so only the order can tell their gates apart: the rack-grouped
order is faster than the launcher's and passes; the rollout after it, whose order crosses the spine on every
hop again, is slower than the now-stable rack-grouped order and fails, and the fleet is back on the stable one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from tests.controller.rollout.test_gate_benchmarks import gate_controller, settled
from tests.support.sim_agent import sim_agent
from topo_tune.agent.daemon import Agent
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.rollout.gates import Outcome
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.controller.rollout.state import RolloutPhase
from topo_tune.controller.server import Controller
from topo_tune.versions.version import ConfigVersion, render_nccl_conf

pytestmark = pytest.mark.slow

RACK_OF = {"n1": "rack-1", "n2": "rack-2", "n3": "rack-1", "n4": "rack-2"}
SETTINGS = render_nccl_conf({"NCCL_DEBUG": "WARN"})


def ordered(order: list[str]) -> ConfigVersion:
    rank_map = {"version": 1, "planned": {"node_order": order}, "naive": {"node_order": sorted(order)}}
    return ConfigVersion({"nccl.conf": SETTINGS, "rankmap.json": json.dumps(rank_map)})


GROUPED = ordered(["n1", "n3", "n2", "n4"])  # two spine crossings per ring
INTERLEAVED = ordered(["n1", "n4", "n3", "n2"])  # every hop crosses the spine (as the launcher's n1..n4 does)


@pytest.fixture
async def two_racks(sqlite_url: str, tmp_path: Path) -> AsyncIterator[tuple[Controller, dict[str, Agent]]]:
    config = tmp_path / "config"  # the agents' config directory: one path on every node
    controller = gate_controller(sqlite_url, config, spine_oversubscription=4.0)
    await controller.start()
    try:
        async with AsyncExitStack() as stack:
            agents = {
                node: await stack.enter_async_context(
                    sim_agent(controller.port, tmp_path / node, node=node, rack=rack, config_dir=config)
                )
                for node, rack in RACK_OF.items()
            }
            yield controller, agents
    finally:
        await controller.stop()


async def test_a_gate_passes_a_better_order_and_fails_an_order_worse_than_the_stable_ones(
    two_racks: tuple[Controller, dict[str, Agent]],
) -> None:
    controller, agents = two_racks
    # One wave over both racks: the ring over the wave's nodes is what the order changes.
    policy = PlanPolicy(canary_nodes=0, max_parallel_racks=2, gate=RolloutGateConfig(repeats=7))
    thresholds = RolloutThresholdsConfig()

    better = await controller.rollouts.create(GROUPED, policy=policy, thresholds=thresholds, actor="t")
    await settled(controller, better.rollout.id, RolloutPhase.COMPLETED)
    [gate] = await controller.rollout_store.gates(better.rollout.id)
    assert gate.verdict.outcome is Outcome.SUCCESSFUL, gate.verdict.reasons
    assert gate.verdict.time_change < -0.03, "faster than NCCL's defaults in the launcher's order"
    assert {a.config_store.active_version() for a in agents.values()} == {GROUPED.id}
    orders = {tuple(job.nodes) for job in await controller.jobs.list(limit=100)}
    assert orders == {("n1", "n3", "n2", "n4"), ("n1", "n2", "n3", "n4")}, "each arm in its own order"

    worse = await controller.rollouts.create(INTERLEAVED, policy=policy, thresholds=thresholds, actor="t")
    assert worse.rollout.previous_version == GROUPED.id
    final = await settled(controller, worse.rollout.id, RolloutPhase.ROLLED_BACK)
    [gate] = await controller.rollout_store.gates(worse.rollout.id)
    assert gate.verdict.outcome is Outcome.FAILED, gate.verdict.reasons
    assert gate.verdict.time_change > 0.03 and "communication time" in gate.verdict.reasons[0]
    assert "wave 0 gate failed" in final.rollout.reason
    assert {a.config_store.active_version() for a in agents.values()} == {GROUPED.id}, "back on the stable order"
