"""Gates measured by real benchmark jobs: the controller's verifier runs A/B jobs on a ``sim`` agent.

The sim backend reads the version's ``nccl.conf`` through ``NCCL_CONF_FILE`` as NCCL would, so a version
that turns NVLS off and caps NCCL at one CTA is measurably slower: its gate fails and the rollout rolls back
by itself; a version without a performance effect shows no gain, so its gate is inconclusive and the
rollout waits for a human.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import controller_settings
from tests.support.processes import TOKEN
from tests.support.sim_agent import sim_agent
from tests.support.waiting import async_wait_until
from topo_tune.agent.daemon import Agent
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.client.watch_step import WatchStep
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.controller.rollout.gates import Outcome
from topo_tune.controller.rollout.plan import PlanPolicy
from topo_tune.controller.rollout.state import RolloutPhase, Snapshot
from topo_tune.controller.rollout.verification import BenchmarkVerifier
from topo_tune.controller.server import Controller
from topo_tune.rollout_record import RolloutInfo
from topo_tune.versions.version import ConfigVersion, render_nccl_conf

pytestmark = pytest.mark.slow

SLOW = ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_NVLS_ENABLE": "0", "NCCL_MAX_CTAS": "1"})})
NEUTRAL = ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_DEBUG": "WARN"})})


def gate_controller(sqlite_url: str, config_dir: Path, **overrides: object) -> Controller:
    """A controller whose rollouts run their gates promptly, its agents' config directory ``config_dir``."""
    return Controller(
        controller_settings(
            sqlite_url,
            rollout_interval_s=0.05,
            heartbeat_expiry_s=30,
            benchmark_result_grace_s=0.5,
            agent_config_dir=config_dir,
            **overrides,
        )
    )


@pytest.fixture
async def one_sim_node(sqlite_url: str, tmp_path: Path) -> AsyncIterator[tuple[Controller, Agent]]:
    controller = gate_controller(sqlite_url, tmp_path / "config")
    await controller.start()
    assert isinstance(controller.rollouts.verifier, BenchmarkVerifier)
    try:
        async with sim_agent(controller.port, tmp_path) as agent:
            yield controller, agent
    finally:
        await controller.stop()


async def settled(controller: Controller, rollout_id: str, *phases: RolloutPhase) -> Snapshot:
    async def reached() -> Snapshot | None:
        snapshot = await controller.rollout_store.load(rollout_id)
        return snapshot if snapshot.rollout.phase in phases else None

    return await async_wait_until(reached, timeout=60, what=f"rollout {rollout_id} to reach {phases}")


async def test_gates_measured_by_benchmark_jobs_roll_back_a_slow_version_and_pause_on_no_gain(
    one_sim_node: tuple[Controller, Agent], tmp_path: Path
) -> None:
    controller, agent = one_sim_node
    policy = PlanPolicy(canary_nodes=0, gate=RolloutGateConfig(repeats=7))
    slow = await controller.rollouts.create(SLOW, policy=policy, thresholds=RolloutThresholdsConfig(), actor="t")
    # Followed through the admin API's watch stream: each committed step, then the end.
    updates: list[WatchStep[RolloutInfo]] = []
    with AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as client:
        watched = await asyncio.to_thread(client.watch_rollout, slow.rollout.id, updates.append)
    assert watched.phase == "rolled_back" and all(u.total == 1 for u in updates)
    assert [u.value.phase for u in updates][-1:] == ["rolled_back"]
    assert "verifying" in [u.value.phase for u in updates], "the gate's step was seen as it was committed"
    final = await settled(controller, slow.rollout.id, RolloutPhase.ROLLED_BACK)
    [gate] = await controller.rollout_store.gates(slow.rollout.id)
    assert gate.verdict.outcome is Outcome.FAILED, gate.verdict.reasons
    assert gate.verdict.pairs == 7 and gate.verdict.time_change > 0.03
    assert "wave 0 gate failed" in final.rollout.reason
    assert agent.config_store.active_version() == "", "back on NCCL's defaults"
    jobs = await controller.jobs.list(limit=100)
    conf_files = {job.env.get("NCCL_CONF_FILE", "defaults") for job in jobs}
    assert conf_files == {str(tmp_path / "config" / "versions" / SLOW.id / "nccl.conf"), "defaults"}
    assert all(job.simulated for job in jobs) and len(jobs) == 14, "7 interleaved A/B repeats"

    neutral = await controller.rollouts.create(NEUTRAL, policy=policy, thresholds=RolloutThresholdsConfig(), actor="t")
    args = ["admin", "rollout", "status", neutral.rollout.id, "--wait", "--controller", f"127.0.0.1:{controller.port}"]
    waiting = asyncio.create_task(
        asyncio.to_thread(CliRunner().invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    )  # an operator follows it up to the pause, which waits for them
    paused = await settled(controller, neutral.rollout.id, RolloutPhase.PAUSED)
    assert "gain of 3% not shown" in paused.rollout.reason
    stopped = await asyncio.wait_for(waiting, 60)
    assert stopped.exit_code == 3, stopped.output
    assert "# paused, 0/1 waves done (" in stopped.stderr and "gain of 3% not shown" in stopped.stderr
    assert f"topo-tune admin rollout resume {neutral.rollout.id}" in stopped.stderr
    await controller.rollouts.promote(neutral.rollout.id, actor="operator")
    waiting = asyncio.create_task(
        asyncio.to_thread(CliRunner().invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    )  # promoted, then followed again to its end
    done = await settled(controller, neutral.rollout.id, RolloutPhase.COMPLETED)
    assert done.rollout.phase is RolloutPhase.COMPLETED
    followed = await asyncio.wait_for(waiting, 60)
    assert followed.exit_code == 0, followed.output
    assert f"rollout {neutral.rollout.id}: " in followed.stdout and "[completed]" in followed.stdout
    assert agent.config_store.active_version() == NEUTRAL.id


ONE_CHANNEL_TABLE = ConfigVersion(
    {
        "nccl.conf": render_nccl_conf({"NCCL_DEBUG": "WARN"}),
        "nccl_tuner.conf": "allreduce,0,17179869184,ring,simple,1,-1,-1,-1,-1\n",
    }
)


async def test_a_gate_measures_the_versions_tuner_table_not_only_its_environment(
    one_sim_node: tuple[Controller, Agent],
) -> None:
    # The environment alone is neutral (see NEUTRAL above); the table holds every all_reduce to ring/simple on
    # one channel. Only a gate whose jobs carry the version's table can see it.
    controller, agent = one_sim_node
    policy = PlanPolicy(canary_nodes=0, gate=RolloutGateConfig(repeats=7))
    table = await controller.rollouts.create(
        ONE_CHANNEL_TABLE, policy=policy, thresholds=RolloutThresholdsConfig(), actor="t"
    )
    await settled(controller, table.rollout.id, RolloutPhase.ROLLED_BACK)
    [gate] = await controller.rollout_store.gates(table.rollout.id)
    assert gate.verdict.outcome is Outcome.FAILED, gate.verdict.reasons
    assert gate.verdict.time_change > 0.03
    assert agent.config_store.active_version() == ""


async def test_a_graph_timed_gate_on_nodes_without_nccl_is_inconclusive_with_the_reason(
    one_sim_node: tuple[Controller, Agent],
) -> None:
    # The admin API refuses such a rollout up front; one created before a node changed backend meets the
    # controller's own job check: the gate cannot run, so the rollout waits for a human instead of judging.
    controller, _ = one_sim_node
    policy = PlanPolicy(canary_nodes=0, gate=RolloutGateConfig(repeats=2, cuda_graph=True))
    created = await controller.rollouts.create(NEUTRAL, policy=policy, thresholds=RolloutThresholdsConfig(), actor="t")
    paused = await settled(controller, created.rollout.id, RolloutPhase.PAUSED)
    [gate] = await controller.rollout_store.gates(created.rollout.id)
    assert gate.verdict.outcome is Outcome.INCONCLUSIVE
    assert "cuda_graph: CUDA graphs need the nccl backend; the nodes run sim" in gate.verdict.reasons[0]
    assert "cuda_graph" in paused.rollout.reason
    assert await controller.jobs.list(limit=10) == [], "no job was dispatched"


async def test_a_gate_whose_jobs_the_agents_refuse_names_the_cause_in_the_rollout_status(
    sqlite_url: str, tmp_path: Path
) -> None:
    # The agent stages versions under its own --config-dir; the controller still points gate jobs at the
    # default one. Each job is refused by the agent's env policy: the verdict says so, not only "0 A/B pairs".
    controller = gate_controller(sqlite_url, Path("/etc/nccl/topo-tune"))
    await controller.start()
    try:
        async with sim_agent(controller.port, tmp_path):
            policy = PlanPolicy(canary_nodes=0, gate=RolloutGateConfig(repeats=2))
            thresholds = RolloutThresholdsConfig()
            created = await controller.rollouts.create(NEUTRAL, policy=policy, thresholds=thresholds, actor="t")
            await settled(controller, created.rollout.id, RolloutPhase.PAUSED)
            args = ["admin", "rollout", "status", created.rollout.id, "--controller", f"127.0.0.1:{controller.port}"]
            shown = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    finally:
        await controller.stop()
    assert shown.exit_code == 0, shown.output
    reason = " ".join(line for line in shown.output.splitlines() if line.startswith("reason: "))
    assert "every gate job failed" in reason and "is outside the agent's config directories" in reason, reason
    assert "rollout.agentConfigDir" in reason and "--config-dir" in reason, reason
