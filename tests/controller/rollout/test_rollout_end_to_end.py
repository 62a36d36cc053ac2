"""Rollouts end to end: a controller on loopback, real in-process agents of the ``sim`` backend in 4 racks,
the admin client and the job-side CLI.

The gate's A/B samples come from ``SimVerifier`` (no benchmark dispatcher is wired to gates yet); everything
else is real: ApplyConfig commands over gRPC, each agent's config store on disk, reported versions.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner

from tests.conftest import controller_settings
from tests.controller.rollout.fleet import V1, V2, V3, SimVerifier, racks
from tests.support.processes import TOKEN
from tests.support.waiting import async_wait_until
from topo_tune.agent.config_store import jobs_lock_shared
from topo_tune.agent.daemon import Agent
from topo_tune.agent.settings import AgentSettings
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.controller.server import Controller
from topo_tune.errors import ConflictError
from topo_tune.nccl.backends import Backend
from topo_tune.node_record import NodeInfo
from topo_tune.rollout_record import RolloutAction, RolloutInfo, RolloutRequest
from topo_tune.v1 import topology_pb2
from topo_tune.versions.version import ConfigVersion

T = TypeVar("T")
RACKS = racks(4, 2)


@dataclass
class Cluster:
    controller: Controller
    agents: dict[str, Agent]
    client: AdminClient
    address: str

    async def call(self, method: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Admin calls are synchronous gRPC: keep them off the loop the controller serves on."""
        return await asyncio.to_thread(method, *args, **kwargs)

    async def wait_phase(self, rollout_id: str, *phases: str) -> RolloutInfo:
        async def reached() -> RolloutInfo | None:
            info = await self.call(self.client.get_rollout, rollout_id)
            return info if info.phase in phases else None

        return await async_wait_until(reached, timeout=30, what=f"rollout {rollout_id} to reach {phases}")

    def active_versions(self) -> dict[str, str]:
        return {name: agent.config_store.active_version() for name, agent in self.agents.items()}


@pytest.fixture
async def cluster(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    # No test here is about losing a node: a 10 s expiry keeps a busy machine from losing the agents mid-rollout
    # (a lost node pauses the rollout for that reason instead of the one a test waits for).
    controller = Controller(controller_settings(sqlite_url, rollout_interval_s=0.05, heartbeat_expiry_s=10.0))
    await controller.start()
    address = f"127.0.0.1:{controller.port}"
    agents: dict[str, Agent] = {}
    stop = asyncio.Event()
    tasks = []
    for name, rack in RACKS.items():
        settings = AgentSettings(
            controller=address,
            node_name=name,
            token=TOKEN,
            rack=rack,
            backend=Backend.SIM,
            state_dir=tmp_path / name,
            config_dir=tmp_path / name / "config",
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
        )
        agent = Agent(settings, discover=lambda n=name: topology_pb2.NodeTopology(hostname=n), rng=random.Random(1))
        agents[name] = agent
        tasks.append(asyncio.create_task(agent.run(stop)))
    for agent in agents.values():
        await asyncio.wait_for(agent.registered.wait(), 20)
    client = AdminClient(address, token=TOKEN)
    try:
        yield Cluster(controller, agents, client, address)
    finally:
        client.close()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        await controller.stop()


def create_request(version: ConfigVersion, **options: Any) -> RolloutRequest:
    return RolloutRequest(files=dict(version.files), actor="test", **options)


async def test_a_full_rollout_across_four_racks_of_sim_agents(cluster: Cluster) -> None:
    cluster.controller.rollouts.verifier = SimVerifier(RACKS)
    plan = await cluster.call(cluster.client.create_rollout, create_request(V1, dry_run=True))
    assert plan.dry_run and "5 waves, 8 nodes" in plan.plan
    assert await cluster.call(cluster.client.list_rollouts) == [], "a dry run stores nothing"

    created = await cluster.call(cluster.client.create_rollout, create_request(V1, rollout_id="ro-v1"))
    assert [w.kind for w in created.waves] == ["canary", "racks", "racks", "racks", "racks"]
    done = await cluster.wait_phase("ro-v1", "completed")
    assert [g.outcome for g in done.gates] == ["successful"] * 5
    assert cluster.active_versions() == dict.fromkeys(RACKS, V1.id), "every agent activated the new version"
    nodes = await cluster.call(cluster.client.list_nodes)
    assert {n.applied_config_version for n in nodes} == {V1.id}, "and reports it"
    history = await cluster.call(cluster.client.rollout_history, "ro-v1")
    assert history[0].actor == "test" and history[-1].after == "completed"


async def test_a_regressed_rack_rolls_back_and_jobs_keep_one_pinned_version(cluster: Cluster, tmp_path: Path) -> None:
    cluster.controller.rollouts.verifier = SimVerifier(RACKS)
    await cluster.call(cluster.client.create_rollout, create_request(V1, rollout_id="ro-v1", no_canary=True))
    await cluster.wait_phase("ro-v1", "completed")

    cluster.controller.rollouts.verifier = SimVerifier(RACKS, regressed_racks=frozenset({"rack-3"}))
    request = create_request(V2, rollout_id="ro-v2", canary_rack="rack-1", require_approval=True)
    await cluster.call(cluster.client.create_rollout, request)
    with pytest.raises(ConflictError, match="still active"):
        await cluster.call(cluster.client.create_rollout, create_request(V3, rollout_id="ro-x"))
    paused = await cluster.wait_phase("ro-v2", "paused")
    assert paused.wave == 1 and "approval" in paused.reason

    resolve = cluster.client.resolve_job_config
    assert (await cluster.call(resolve, "job-a", ["r1n1", "r1n2"])).config_version == V2.id, "inside rack-1"
    spanning = await cluster.call(resolve, "job-b", ["r1n1", "r2n1"])
    assert spanning.config_version == V1.id, "a job spanning a migrated and an unmigrated rack"

    await cluster.call(cluster.client.change_rollout, "ro-v2", RolloutAction.PROMOTE, actor="op")
    await async_wait_until(lambda: _wave_completed(cluster, "ro-v2", 1), timeout=30, what="wave 1 (rack-2) to complete")
    assert (await cluster.call(resolve, "job-b", ["r1n1", "r2n1"])).config_version == V1.id, "pinned"
    assert (await cluster.call(resolve, "job-c", ["r1n1", "r2n1"])).config_version == V2.id, "a new job"

    # The job-side CLI: env prints the pinned version's staged file; exec runs a real process with it.
    runner = CliRunner()
    args = ["env", "--controller", cluster.address, "--job-id", "job-b", "--nodes", "r1n1,r2n1"]
    args += ["--config-dir", str(tmp_path / "r1n1" / "config")]
    printed = await asyncio.to_thread(runner.invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    assert printed.exit_code == 0, printed.output
    conf = tmp_path / "r1n1" / "config" / "versions" / V1.id / "nccl.conf"
    assert f"export NCCL_CONF_FILE={conf}" in printed.output
    assert conf.read_text() == V1.files["nccl.conf"], "the previous version is still staged on a migrated node"
    elsewhere = [*args[:-2], "--config-dir", str(tmp_path / "not-the-agents"), "--node", "r1n1"]
    unstaged = await asyncio.to_thread(runner.invoke, cli, elsewhere, env={"TOPO_TUNE_TOKEN": TOKEN})
    assert unstaged.exit_code == 1 and "NCCL_CONF_FILE" not in unstaged.output, "no path that is not there"
    assert f"{V1.id} is not staged on this node" in unstaged.output and "--config-dir" in unstaged.output
    shown = await _exec_conf(cluster, tmp_path / "r2n1" / "config", "job-c", "r1n1,r2n1")
    assert shown == str(tmp_path / "r2n1" / "config" / "versions" / V2.id / "nccl.conf")
    r3n1 = tmp_path / "r3n1" / "config"
    refused = await _exec_conf(cluster, r3n1, "job-c", "r1n1,r2n1", returncode=1, node="r2n1")
    assert f"{V2.id} is not staged on this node" in refused, "a rank on a node without the version never starts"
    outside = await _exec_conf(cluster, r3n1, "job-c", "r1n1,r2n1", returncode=1)
    assert "--node: 'r3n1' is not one of the job's 2 nodes" in outside, "the agent's recorded name: not in the job"

    await cluster.call(cluster.client.change_rollout, "ro-v2", RolloutAction.PROMOTE, actor="op")
    final = await cluster.wait_phase("ro-v2", "rolled_back")
    assert "wave 2 gate failed" in final.reason
    assert cluster.active_versions() == dict.fromkeys(RACKS, V1.id), "no node left on the new version"
    history = await cluster.call(cluster.client.rollout_history, "ro-v2")
    assert any(t.actor == "op" for t in history)


async def _wave_completed(cluster: Cluster, rollout_id: str, wave: int) -> bool:
    info = await cluster.call(cluster.client.get_rollout, rollout_id)
    return info.waves[wave].phase == "completed"


async def _exec_conf(
    cluster: Cluster, config_dir: Path, job_id: str, nodes: str, returncode: int = 0, node: str = ""
) -> str:
    environ = {**os.environ, "TOPO_TUNE_TOKEN": TOKEN, "TOPO_TUNE_CONTROLLER": cluster.address}
    environ.pop("TOPO_TUNE_NODE_NAME", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "topo_tune",
        "exec",
        "--job-id",
        job_id,
        "--nodes",
        nodes,
        "--config-dir",
        str(config_dir),
        *(["--node", node] if node else []),
        "--",
        sys.executable,
        "-c",
        "import os; print(os.environ['NCCL_CONF_FILE'])",
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == returncode, err.decode()
    return (out if returncode == 0 else err).decode().strip()


async def test_the_admin_rollout_commands(cluster: Cluster, tmp_path: Path) -> None:
    cluster.controller.rollouts.verifier = SimVerifier(RACKS)
    conf = tmp_path / "nccl.conf"
    conf.write_text(V1.files["nccl.conf"])
    runner = CliRunner()

    async def run(*args: str) -> str:
        full = ["admin", "rollout", *args, "--controller", cluster.address]
        result = await asyncio.to_thread(runner.invoke, cli, full, env={"TOPO_TUNE_TOKEN": TOKEN})
        assert result.exit_code == 0, result.output
        return result.output

    planned = await run("create", "--file", f"nccl.conf={conf}", "--canary-rack", "rack-2", "--dry-run")
    assert f"plan for {V1.id}" in planned and "rack-2" in planned.splitlines()[2]
    started = await run(
        "create", "--file", f"nccl.conf={conf}", "--no-canary", "--require-approval", "--id", "ro-cli", "--yes"
    )
    assert "4 waves, 8 nodes" in started and "rollout ro-cli" in started
    await cluster.wait_phase("ro-cli", "paused")
    status = await run("status", "ro-cli")
    assert "[paused]" in status and "waiting for approval" in status and "successful" in status
    await run("pause", "ro-cli")  # already paused: a no-op, not an error
    rolled = await run("rollback", "ro-cli", "--reason", "changed my mind")
    assert "rolling_back" in rolled or "rolled_back" in rolled
    await cluster.wait_phase("ro-cli", "rolled_back")
    assert set(cluster.active_versions().values()) == {""}, "back on NCCL's defaults"
    history = await run("history", "ro-cli")
    assert "changed my mind" in history and "rolled_back" in history
    listed = await run("list", "-o", "json")
    assert '"id": "ro-cli"' in listed

    failed = await asyncio.to_thread(
        runner.invoke,
        cli,
        ["admin", "rollout", "promote", "ro-cli", "--controller", cluster.address],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert failed.exit_code == 1 and "only a paused rollout can be promoted" in failed.output

    target = ["--controller", cluster.address]
    graphs = await asyncio.to_thread(
        runner.invoke,
        cli,
        ["admin", "rollout", "create", "--file", f"nccl.conf={conf}", "--gate-cuda-graph", "--yes", *target],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert graphs.exit_code != 0
    assert "error: --gate-cuda-graph: CUDA graphs need the nccl backend; node" in graphs.output
    assert "runs sim (and 7 more)" in graphs.output
    few = await asyncio.to_thread(
        runner.invoke,
        cli,
        ["admin", "rollout", "create", "--file", f"nccl.conf={conf}", "--gate-repeats", "2", "--yes", *target],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert few.exit_code != 0
    assert "error: --gate-repeats: 2 A/B repeats can never show p < 0.01: at least 7 are needed" in few.output
    assert [r.id for r in await cluster.call(cluster.client.list_rollouts)] == ["ro-cli"], "nothing was created"


async def test_a_changed_active_version_is_reported_refused_to_jobs_and_re_applied(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.controller.rollouts.verifier = SimVerifier(RACKS)
    await cluster.call(cluster.client.create_rollout, create_request(V1, rollout_id="ro-v1", no_canary=True))
    await cluster.wait_phase("ro-v1", "completed")
    repaired = cluster.agents["r1n1"].config_store
    conf = repaired.root / "active" / "nccl.conf"
    runs_before = {name: len(list((tmp_path / name / "config" / "versions").iterdir())) for name in RACKS}

    async def reported() -> NodeInfo | None:
        node = await cluster.call(cluster.client.get_node, "r1n1")
        return node if node.config_damage else None

    cluster.controller.rollouts.retry_after_s = 0.2
    lock = jobs_lock_shared(repaired.root)  # a job runs on r1n1, so nothing may change its config yet
    assert lock is not None
    try:
        # What NCCL_DEBUG_FILE=<config dir>/active/nccl.conf did: NCCL's log line in place of the settings.
        conf.write_text("r1n1:1:1 [0] NCCL WARN Cuda failure\n")
        refused = await _exec_conf(cluster, repaired.root, "job-t", "r1n1", returncode=1)
        assert f"staged version {V1.id} does not match its id" in refused, "no job is handed the changed file"
        # Reported with the heartbeat, in the admin output and the metric.
        node = await async_wait_until(reported, timeout=20, what="r1n1 to report its damaged config")
        assert "does not match its id" in node.config_damage and node.applied_config_version == V1.id
        listed = await asyncio.to_thread(
            CliRunner().invoke, cli, ["admin", "nodes", "--controller", cluster.address], env={"TOPO_TUNE_TOKEN": TOKEN}
        )
        assert f"{V1.id} DAMAGED" in listed.output, listed.output
        await cluster.controller.schedule.sweep()
        assert cluster.controller.metrics.registry.get_sample_value("topo_tune_nodes_config_damaged") == 1.0
    finally:
        os.close(lock)

    # Once the job is gone, the controller's next attempt re-applies the version; the report clears.
    async def whole() -> bool:
        return conf.read_text() == V1.files["nccl.conf"]

    await async_wait_until(whole, timeout=20, what="the controller to re-apply V1")

    async def cleared() -> bool:
        return not (await cluster.call(cluster.client.get_node, "r1n1")).config_damage

    await async_wait_until(cleared, timeout=20, what="r1n1's report to clear")
    shown = await _exec_conf(cluster, repaired.root, "job-t2", "r1n1")
    assert shown == str(repaired.root / "versions" / V1.id / "nccl.conf")
    await cluster.controller.schedule.sweep()
    sample = cluster.controller.metrics.registry.get_sample_value("topo_tune_nodes_config_damaged")
    assert sample == 0.0
    assert cluster.active_versions() == dict.fromkeys(RACKS, V1.id)
    after = {name: len(list((tmp_path / name / "config" / "versions").iterdir())) for name in RACKS}
    assert after == runs_before, "only the damaged node was touched, and it kept one copy"


async def test_status_wait_returns_when_the_rollout_pauses_and_says_how_to_go_on(cluster: Cluster) -> None:
    cluster.controller.rollouts.verifier = SimVerifier(RACKS)
    request = create_request(V1, rollout_id="ro-wait", no_canary=True, require_approval=True)
    await cluster.call(cluster.client.create_rollout, request)
    environ = {**os.environ, "TOPO_TUNE_TOKEN": TOKEN, "TOPO_TUNE_CONTROLLER": cluster.address}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "topo_tune",
        "admin",
        "rollout",
        "status",
        "ro-wait",
        "--wait",
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
    said = err.decode()
    assert process.returncode == 3, said
    assert "rollout ro-wait is paused: waiting for approval" in said
    assert "topo-tune admin rollout resume ro-wait" in said and "promote ro-wait" in said
    assert "[paused]" in out.decode(), "the status table is shown as without --wait"
    # A wait on a rollout that is already paused returns at once, the same way.
    again = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "rollout", "status", "ro-wait", "--wait", "--controller", cluster.address],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert again.exit_code == 3, again.output
