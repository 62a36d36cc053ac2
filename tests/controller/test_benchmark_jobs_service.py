"""Benchmark jobs through the controller: real agents, real gloo workers, the sim backend, deadlines."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import grpc
import grpc.aio
import pytest
from click.testing import CliRunner, Result

from tests.agent.test_daemon import RunningAgent, agent_settings
from tests.conftest import controller_settings
from tests.support.processes import TOKEN, process_gone
from tests.support.waiting import async_wait_until
from topo_tune.agent.daemon import Agent
from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobStatus
from topo_tune.benchmark.probe_record import ProbeRound, ProbeStatus
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.client.watch_step import WatchStep
from topo_tune.controller.job_ends import cancel_command
from topo_tune.controller.server import Controller
from topo_tune.errors import ConflictError, NodeBusy, NotFoundError, ValidationError
from topo_tune.kube.idleness import IdleVerdict
from topo_tune.nccl.backends import Backend
from topo_tune.security.auth import bearer_metadata
from topo_tune.sim.node_topology import simulated_node_topology
from topo_tune.topology.sampling import SamplingPolicy
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2
from topo_tune.wire.admin_jobs import benchmark_request_from_proto, probe_request_from_proto

pytestmark = pytest.mark.slow


@pytest.fixture
async def jobs_controller(sqlite_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Controller]:
    """A controller; a test parametrizing this fixture indirectly passes the node idleness check it is built with."""
    settings = controller_settings(sqlite_url, benchmark_result_grace_s=0.5, heartbeat_expiry_s=30)
    server = Controller(settings, idleness=getattr(request, "param", None))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def agents(tmp_path: Path, jobs_controller: Controller) -> AsyncIterator[Callable[..., RunningAgent]]:
    """In-process agents (their benchmark workers are real processes); all stopped afterwards."""
    running: list[RunningAgent] = []

    def start(name: str, backend: str, rack: str = "", *, address: str = "") -> RunningAgent:
        settings = agent_settings(f"127.0.0.1:{jobs_controller.port}", tmp_path / name, name)
        settings = replace(settings, backend=Backend(backend), rack=rack, address=address)
        if backend == "sim":
            agent = Agent(settings, rng=random.Random(0), discover=lambda: simulated_node_topology(name, gpus=4))
        else:
            agent = Agent(settings, rng=random.Random(0))
        stop = asyncio.Event()
        running.append(RunningAgent(agent, stop, asyncio.create_task(agent.run(stop))))
        return running[-1]

    yield start
    for each in running:
        each.stop.set()
    await asyncio.gather(*(each.task for each in running), return_exceptions=True)


async def registered(*started: RunningAgent) -> None:
    await asyncio.gather(*(asyncio.wait_for(each.agent.registered.wait(), 20) for each in started))


def wire_request(nodes: list[str], **fields: object) -> admin_pb2.StartBenchmarkRequest:
    values: dict[str, object] = {
        "collective": agent_pb2.COLLECTIVE_ALL_REDUCE,
        "nodes": nodes,
        "sizes": agent_pb2.SizeSweep(min_bytes=1024, max_bytes=65536, step_factor=8),
        "iters": 5,
        "warmup_iters": 1,
        "deadline_s": 60,
    }
    values.update(fields)
    return admin_pb2.StartBenchmarkRequest(**values)  # type: ignore[arg-type]


def request(nodes: list[str], **fields: object) -> BenchmarkRequest:
    return benchmark_request_from_proto(wire_request(nodes, **fields))


async def finished(controller: Controller, job_id: str, *, timeout: float = 90) -> BenchmarkJob:
    async def done() -> BenchmarkJob | None:
        job = await controller.jobs.get(job_id)
        return job if job.status != JobStatus.RUNNING else None

    return await async_wait_until(done, timeout=timeout, what=f"job {job_id}")


async def test_gloo_job_over_three_agents(jobs_controller: Controller, agents: Callable[..., Agent]) -> None:
    await registered(*(agents(name, "gloo") for name in ("a", "b", "c")))
    job = await jobs_controller.jobs.start(request(["a", "b", "c"]))
    assert job.status == JobStatus.RUNNING
    done = await finished(jobs_controller, job.job_id)
    assert done.status == JobStatus.SUCCEEDED, done.message
    assert done.world_size == 3 and not done.simulated
    assert [s.bytes for s in done.sizes] == [1024, 8192, 65536]
    assert all(s.wrong == 0 and s.checked and s.time_us > 0 and s.busbw_gbps > 0 for s in done.sizes)
    commands = await jobs_controller.commands.list()
    assert sorted(c.id for c in commands) == [f"{job.job_id}-{i}" for i in range(3)]
    # Every node was sent the identical job.
    bodies = {c.body.run_benchmark.SerializeToString(deterministic=True) for c in commands}
    assert len(bodies) == 1


async def test_sim_job_is_labelled_simulated(jobs_controller: Controller, agents: Callable[..., Agent]) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    job = await jobs_controller.jobs.start(
        request(["s1", "s2"], sizes=agent_pb2.SizeSweep(min_bytes=1 << 20, max_bytes=1 << 28, step_factor=16))
    )
    done = await finished(jobs_controller, job.job_id)
    assert done.status == JobStatus.SUCCEEDED, done.message
    assert done.simulated
    assert done.world_size == 8, "every simulated GPU is a rank"
    busbw = [s.busbw_gbps for s in done.sizes]
    assert busbw == sorted(busbw) and busbw[-1] > 10


async def test_a_sim_job_runs_its_candidate_tuner_table(
    jobs_controller: Controller, agents: Callable[..., Agent]
) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    sizes = agent_pb2.SizeSweep(min_bytes=1 << 20, max_bytes=1 << 28, step_factor=16)
    times = []
    for table in ("", "allreduce,16777217,4294967296,-1,-1,1,2,8\n"):  # 1 channel above 16 MiB, 2 nodes x 4 GPUs
        job = await jobs_controller.jobs.start(request(["s1", "s2"], sizes=sizes, tuner_table=table))
        done = await finished(jobs_controller, job.job_id)
        assert done.status == JobStatus.SUCCEEDED, done.message
        times.append({s.bytes: s.time_us for s in done.sizes})
    plain, tabled = times
    assert tabled[1 << 20] == pytest.approx(plain[1 << 20], rel=0.2), "sizes no row matches keep NCCL's choice"
    assert tabled[1 << 28] > 4 * plain[1 << 28], "the row's single channel applies above 16 MiB"


async def test_a_silent_node_times_the_job_out_and_the_next_job_runs(
    jobs_controller: Controller, agents: Callable[..., Agent]
) -> None:
    ghost = agents("ghost", "gloo")
    await registered(agents("a", "gloo"), agents("b", "gloo"), ghost)
    # The deadline must leave the live ranks time to reach the rendezvous, or they are missing too: three
    # times what a whole job of theirs takes now (workers' torch imports included), measured in this test,
    # since a 2-core machine busy with other tests takes many times longer than an idle one.
    started_at = time.monotonic()
    baseline = await jobs_controller.jobs.start(request(["a", "b"]))
    assert (await finished(jobs_controller, baseline.job_id)).status == JobStatus.SUCCEEDED
    deadline_s = max(12, math.ceil(3 * (time.monotonic() - started_at)))
    # A lost node would fail the job before its deadline: the expiry is not what this test is about.
    jobs_controller.registry.expiry_s = max(jobs_controller.registry.expiry_s, deadline_s + 60.0)

    # The ghost's agent goes away; the node stays `ready` until its expiry, so it is given a share.
    await ghost.shutdown()
    await async_wait_until(lambda: _disconnected(jobs_controller, "ghost"), what="ghost disconnected")
    job = await jobs_controller.jobs.start(request(["a", "b", "ghost"], deadline_s=deadline_s))
    with pytest.raises(ConflictError, match="node a is running benchmark job"):
        await jobs_controller.jobs.start(request(["a"]))
    done = await finished(jobs_controller, job.job_id, timeout=deadline_s + 90)
    assert done.status == JobStatus.TIMED_OUT
    assert list(done.missing_ranks) == [2], done.message
    assert "ghost" in done.message

    again = await jobs_controller.jobs.start(request(["a", "b"]))
    assert (await finished(jobs_controller, again.job_id)).status == JobStatus.SUCCEEDED


async def _disconnected(controller: Controller, name: str) -> bool:
    return not controller.hub.connected(name)


async def test_bad_requests_name_their_field(jobs_controller: Controller, agents: Callable[..., Agent]) -> None:
    await registered(agents("a", "gloo"), agents("s1", "sim"))
    with pytest.raises(NotFoundError, match="ghost"):
        await jobs_controller.jobs.start(request(["ghost"]))
    with pytest.raises(ValidationError, match="collective"):
        await jobs_controller.jobs.start(request(["a"], collective=0))
    with pytest.raises(ValidationError, match="nodes"):
        await jobs_controller.jobs.start(request(["a", "a"]))
    with pytest.raises(ValidationError, match="different backends"):
        await jobs_controller.jobs.start(request(["a", "s1"]))
    with pytest.raises(ValidationError, match="max_bytes"):
        await jobs_controller.jobs.start(request(["a"], sizes=agent_pb2.SizeSweep(min_bytes=64, max_bytes=8)))
    with pytest.raises(ValidationError, match="cuda_graph: CUDA graphs need the nccl backend; the nodes run gloo"):
        await jobs_controller.jobs.start(request(["a"], cuda_graph=True))
    with pytest.raises(ValidationError, match=r"tuner_table: line 1: protocol 'll64' is not one of ll, ll128, simple"):
        await jobs_controller.jobs.start(request(["a"], tuner_table="allreduce,0,1024,ring,ll64,4,-1,-1\n"))
    drain = await jobs_controller.commands.submit("a", agent_pb2.Command(drain=agent_pb2.Drain(drained=True)))
    await jobs_controller.hub.deliver_new(drain)
    await async_wait_until(lambda: _drained(jobs_controller, "a"), what="drain")
    with pytest.raises(ConflictError, match="drained"):
        await jobs_controller.jobs.start(request(["a"]))
    # Through real gRPC: the node's state is wrong (FAILED_PRECONDITION), not the request's id (ALREADY_EXISTS).
    async with grpc.aio.insecure_channel(f"127.0.0.1:{jobs_controller.port}") as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.StartBenchmark(wire_request(["a"]), metadata=bearer_metadata(TOKEN))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "node a is drained: it takes no benchmark job"
    # ... and the CLI prints it as that one line.
    printed = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "bench", "run", "--nodes", "a", "--controller", f"127.0.0.1:{jobs_controller.port}"],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert (printed.exit_code, printed.output) == (
        1,
        "topo-tune: error: node a is drained: it takes no benchmark job\n",
    )
    assert await jobs_controller.jobs.list() == []


async def _drained(controller: Controller, name: str) -> bool:
    return (await controller.registry.get(name)).drained


async def test_admin_rpc_and_cli_print_an_nccl_tests_table(
    jobs_controller: Controller, agents: Callable[..., Agent]
) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    address = f"127.0.0.1:{jobs_controller.port}"
    result = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "bench", "run", "--nodes", "s1,s2", "-b", "1K", "-e", "1M", "-f", "32", "--controller", address],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "# SIMULATED: figures from topo-tune's analytic model, not a measurement" in lines
    assert (
        "# nRanks 8 minBytes 1024 maxBytes 1048576 step: 32(factor) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 0 graph: 0"
    ) in lines
    data_rows = [line for line in lines if line and not line.startswith("#")]
    assert [int(r.split()[0]) for r in data_rows] == [1024, 32768, 1048576]
    refused = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "bench", "run", "--nodes", "s1", "--env", "NCCL_PROTO=LL128", "--controller", address],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert refused.exit_code == 1
    assert "forces it on" in refused.output
    graphed = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", "bench", "run", "--nodes", "s1", "--cuda-graph", "--controller", address],
        env={"TOPO_TUNE_TOKEN": TOKEN},
    )
    assert graphed.exit_code == 1
    assert "error: --cuda-graph: CUDA graphs need the nccl backend; the nodes run sim" in graphed.output


async def test_cli_runs_a_candidate_tuner_table_and_shows_its_digest(
    jobs_controller: Controller, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    await registered(*(agents(name, "sim") for name in ("s1", "s2")))
    address = f"127.0.0.1:{jobs_controller.port}"

    def admin(*args: str) -> Result:
        return CliRunner().invoke(cli, [*args, "--controller", address], env={"TOPO_TUNE_TOKEN": TOKEN})

    table = tmp_path / "candidate.conf"
    table.write_text("# one channel above 16 MiB on 2 nodes x 4 GPUs\nallreduce,16777217,4294967296,-1,-1,1,2,8\n")
    sweep = ("--nodes", "s1,s2", "-b", "1M", "-e", "256M", "-f", "16", "-o", "json")
    plain = await asyncio.to_thread(admin, "admin", "bench", "run", *sweep)
    tabled = await asyncio.to_thread(admin, "admin", "bench", "run", *sweep, "--tuner-table", str(table))
    assert plain.exit_code == 0 and tabled.exit_code == 0, plain.output + tabled.output
    plain_job, tabled_job = json.loads(plain.stdout), json.loads(tabled.stdout)
    digest = hashlib.sha256(table.read_bytes()).hexdigest()
    assert (plain_job["tuner_table_sha256"], tabled_job["tuner_table_sha256"]) == ("", digest)
    times = [{int(s["bytes"]): s["time_us"] for s in job["sizes"]} for job in (plain_job, tabled_job)]
    assert times[1][1 << 28] > 4 * times[0][1 << 28], "the table's single channel ran above 16 MiB"

    shown = await asyncio.to_thread(admin, "admin", "bench", "show", tabled_job["job_id"])
    assert shown.exit_code == 0, shown.output
    assert f"# tuner table sha256 {digest} (loaded by every rank through the plugin)" in shown.stdout.splitlines()
    assert "tuner table" not in (await asyncio.to_thread(admin, "admin", "bench", "show", plain_job["job_id"])).stdout

    bad = tmp_path / "bad.conf"
    bad.write_text("allreduce,0,1024,ring,simple,4,-1,-1\nallreduce,0,1024,ring,ll64,4,-1,-1\n")
    refused = await asyncio.to_thread(admin, "admin", "bench", "run", *sweep, "--tuner-table", str(bad))
    assert refused.exit_code == 2, refused.output
    assert f"{bad}:2: protocol 'll64' is not one of ll, ll128, simple" in refused.output
    empty = tmp_path / "empty.conf"
    empty.write_text("# nothing\n")
    assert (
        "no table rows"
        in (await asyncio.to_thread(admin, "admin", "bench", "run", *sweep, "--tuner-table", str(empty))).output
    )
    assert len(await jobs_controller.jobs.list()) == 2, "a refused table starts no job"


class TrainingOnS2:
    """Kubernetes says node s2 runs a training pod."""

    async def check(self, node_name: str) -> IdleVerdict:
        if node_name == "s2":
            return IdleVerdict(node_name, idle=False, reason="GPU pods on the node: team/train-0")
        return IdleVerdict(node_name, idle=True, reason="no GPU pods")


@pytest.mark.parametrize("jobs_controller", [TrainingOnS2()], indirect=True)
async def test_nodes_with_gpu_pods_take_no_benchmark(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    await registered(agents("s1", "sim"), agents("s2", "sim"))
    with pytest.raises(ConflictError, match="s2: GPU pods on the node: team/train-0"):
        await jobs_controller.jobs.start(request(["s1", "s2"]))
    job = await jobs_controller.jobs.start(request(["s1"]))
    assert (await finished(jobs_controller, job.job_id)).status == JobStatus.SUCCEEDED


async def test_a_probe_round_measures_every_pair_once(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    await registered(*(agents(name, "gloo") for name in ("a", "b", "c", "d")))
    started = await jobs_controller.probes.start(
        probe_request_from_proto(admin_pb2.StartProbeRoundRequest(message_bytes=1 << 16, pair_deadline_s=60))
    )
    assert (started.pairs_total, started.rounds) == (6, 3), "4 nodes: 6 pairs in 3 rounds of 2 parallel pairs"

    # Followed through the admin API's watch stream, as `admin probe run` and `init` do.
    updates: list[WatchStep[ProbeRound]] = []
    with AdminClient(f"127.0.0.1:{jobs_controller.port}", token=TOKEN) as client:
        finished_round = await asyncio.to_thread(client.watch_probe_round, started.round_id, updates.append)
    assert finished_round.status is ProbeStatus.SUCCEEDED, finished_round.message
    progress = [(u.done, u.total) for u in updates]
    assert progress[-1] == (6, 6) and all(total == 6 for _, total in progress), progress
    assert progress == sorted(progress), "pairs measured only go up"
    assert [u.value.status for u in updates[:-1]] == [ProbeStatus.RUNNING] * (len(updates) - 1)
    assert len(updates) <= 1 + 6 + 1, "the start, once per pair stored, the end: never a repeat while idle"
    pairs = {tuple(sorted((m.node_a, m.node_b))) for m in finished_round.measurements}
    assert pairs == {("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("c", "d")}
    assert all(m.bandwidth_gbps > 0 and m.latency_us > 0 for m in finished_round.measurements)
    measured = await jobs_controller.probes.measured_pairs()
    assert len(measured) == 6


async def test_a_sparse_probe_round_probes_rack_rings_and_samples_across_racks(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    racks = {"a1": "ra", "a2": "ra", "a3": "ra", "a4": "ra", "b1": "rb", "b2": "rb", "b3": "rb", "b4": "rb"}
    # One cross-rack pair, and loopback's spread taken for a fabric's: a short round of real probes.
    jobs_controller.probes.sampling_policy = SamplingPolicy(inter_first=1, inter_max=1, outlier=0.95)
    await registered(*(agents(name, "gloo", rack) for name, rack in racks.items()))
    started = await jobs_controller.probes.start(
        probe_request_from_proto(
            admin_pb2.StartProbeRoundRequest(
                message_bytes=1 << 16, pair_deadline_s=60, sampling=admin_pb2.PROBE_SAMPLING_SPARSE
            )
        )
    )
    assert started.sampling == "sparse"

    async def done() -> ProbeRound | None:
        found = await jobs_controller.probes.get(started.round_id)
        return found if found.status != ProbeStatus.RUNNING else None

    finished_round = await async_wait_until(done, timeout=180, what="the sparse probe round")
    assert finished_round.status == ProbeStatus.SUCCEEDED, finished_round.message
    pairs = {tuple(sorted((m.node_a, m.node_b))) for m in finished_round.measurements}
    assert len(pairs) == finished_round.pairs_total == 4 + 4 + 1, "two rack rings and one cross-rack pair"
    intra = [p for p in pairs if racks[p[0]] == racks[p[1]]]
    assert all(sum(node in p for p in intra) >= 2 for node in racks), "a ring through each rack"
    assert 2 <= finished_round.rounds <= 3, "in rounds of disjoint pairs"
    assert list(finished_round.degraded_nodes) == list(finished_round.degraded_uplinks) == []


async def test_a_probe_round_of_listed_pairs_measures_exactly_those(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    await registered(*(agents(name, "gloo") for name in ("a", "b", "c")))
    with pytest.raises(ValidationError, match="pairs"):
        await jobs_controller.probes.start(
            probe_request_from_proto(
                admin_pb2.StartProbeRoundRequest(nodes=["a"], pairs=[admin_pb2.NodePair(node_a="a", node_b="b")])
            )
        )
    with pytest.raises(ValidationError, match=r"pairs\[1\]"):
        await jobs_controller.probes.start(
            probe_request_from_proto(
                admin_pb2.StartProbeRoundRequest(
                    pairs=[admin_pb2.NodePair(node_a="a", node_b="b"), admin_pb2.NodePair(node_a="b", node_b="a")]
                )
            )
        )
    started = await jobs_controller.probes.start(
        probe_request_from_proto(
            admin_pb2.StartProbeRoundRequest(
                pairs=[admin_pb2.NodePair(node_a="c", node_b="a")], message_bytes=1 << 16, pair_deadline_s=60
            )
        )
    )
    assert (started.pairs_total, started.rounds) == (1, 1)

    async def done() -> ProbeRound | None:
        found = await jobs_controller.probes.get(started.round_id)
        return found if found.status != ProbeStatus.RUNNING else None

    finished_round = await async_wait_until(done, timeout=120, what="the listed probe round")
    assert finished_round.status == ProbeStatus.SUCCEEDED, finished_round.message
    assert [(m.node_a, m.node_b) for m in finished_round.measurements] == [("c", "a")]


async def test_the_sampling_policy_defaults_to_full_for_small_clusters_and_refuses_unknown_values(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    await registered(*(agents(name, "gloo") for name in ("a", "b")))
    with pytest.raises(ValidationError, match="sampling"):
        await jobs_controller.probes.start(probe_request_from_proto(admin_pb2.StartProbeRoundRequest(sampling=7)))  # type: ignore[arg-type]
    started = await jobs_controller.probes.start(
        probe_request_from_proto(admin_pb2.StartProbeRoundRequest(pair_deadline_s=60))
    )
    assert started.sampling == "full"


async def test_a_probe_deadline_no_agent_would_keep_is_refused(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    await registered(agents("a", "gloo"), agents("b", "gloo"))
    with pytest.raises(ValidationError, match="pair_deadline_s"):
        await jobs_controller.probes.start(
            probe_request_from_proto(admin_pb2.StartProbeRoundRequest(pair_deadline_s=4_000_000_000))
        )


async def test_sim_nodes_are_not_probed(jobs_controller: Controller, agents: Callable[..., RunningAgent]) -> None:
    await registered(agents("s1", "sim"), agents("s2", "sim"))
    with pytest.raises(ValidationError, match="sim nodes have no network to probe"):
        await jobs_controller.probes.start(probe_request_from_proto(admin_pb2.StartProbeRoundRequest()))


async def _gone_away(controller: Controller, *started: RunningAgent) -> None:
    """Registered nodes whose agents then stopped: still `ready` until their expiry, so a round takes them."""
    await registered(*started)
    for each in started:
        await each.shutdown()
    for each in started:
        name = each.agent.settings.node_name
        await async_wait_until(lambda n=name: _disconnected(controller, n), what=f"{name} disconnected")


async def test_a_probe_nobody_answered_is_not_sent_again_after_its_round(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    await _gone_away(jobs_controller, agents("g1", "gloo"), agents("g2", "gloo"))
    jobs_controller.probes.result_grace_s = 0.0
    started = await jobs_controller.probes.start(
        probe_request_from_proto(admin_pb2.StartProbeRoundRequest(message_bytes=1 << 16, pair_deadline_s=1))
    )

    async def done() -> ProbeRound | None:
        found = await jobs_controller.probes.get(started.round_id)
        return found if found.status != ProbeStatus.RUNNING else None

    failed = await async_wait_until(done, timeout=30, what="the probe round")
    assert failed.status == ProbeStatus.FAILED
    assert "g1-g2: g1: no result by the deadline" in failed.message
    # A node that comes back must not be handed a probe whose peer and round are long gone.
    assert await jobs_controller.commands.outstanding("g1") == []
    assert await jobs_controller.commands.outstanding("g2") == []
    probes = [c for c in await jobs_controller.commands.list() if c.kind == "probe"]
    assert [c.status.value for c in probes] == ["timed_out", "timed_out"]


async def test_probes_of_a_round_cut_short_by_a_restart_are_not_sent_again(sqlite_url: str, tmp_path: Path) -> None:
    first = Controller(controller_settings(sqlite_url, heartbeat_expiry_s=30))
    await first.start()
    try:
        gone = []
        for name in ("g1", "g2"):
            settings = replace(agent_settings(f"127.0.0.1:{first.port}", tmp_path / name, name), backend=Backend.GLOO)
            agent, stop = Agent(settings, rng=random.Random(0)), asyncio.Event()
            gone.append(RunningAgent(agent, stop, asyncio.create_task(agent.run(stop))))
        await _gone_away(first, *gone)
        round_ = await first.probes.start(
            probe_request_from_proto(admin_pb2.StartProbeRoundRequest(message_bytes=1 << 16, pair_deadline_s=600))
        )
        await async_wait_until(lambda: first.commands.outstanding("g1"), what="the probe stored")
    finally:
        await first.stop()
    second = Controller(controller_settings(sqlite_url, heartbeat_expiry_s=30))
    await second.start()
    try:
        assert (await second.probes.get(round_.round_id)).status == ProbeStatus.FAILED
        assert await second.commands.outstanding("g1") == []
        assert await second.commands.outstanding("g2") == []
    finally:
        await second.stop()


@pytest.mark.parametrize(
    ("sizes", "says"),
    [
        ([(12345, 1.0)], "s2: its results do not fit the job: rank 4 reports sizes [12345]"),
        ([(1024, 1.0)], "8192 in_place=False has 4 of 8"),
        ([(1024, float("nan")), (8192, 1.0), (65536, 1.0)], "s2: its results do not fit the job: rank 4 reports"),
    ],
    ids=["a size never asked for", "sizes missing", "a time no run takes"],
)
async def test_results_that_do_not_fit_the_job_fail_it_naming_why(
    jobs_controller: Controller, agents: Callable[..., RunningAgent], sizes: list[tuple[int, float]], says: str
) -> None:
    s1 = agents("s1", "sim")
    await registered(s1)
    await _gone_away(jobs_controller, agents("s2", "sim"))
    job = await jobs_controller.jobs.start(request(["s1", "s2"]))

    async def s1_reported() -> bool:
        return (await jobs_controller.commands.get(f"{job.job_id}-0")).status.final

    await async_wait_until(s1_reported, what="s1's result")
    # s2 (an agent of another version, or a misbehaving one) reports sizes other than the job's three.
    bad = agent_pb2.CommandResult(command_id=f"{job.job_id}-1", status=agent_pb2.COMMAND_STATUS_SUCCEEDED)
    bad.node_benchmark.job_id, bad.node_benchmark.node_name = job.job_id, "s2"
    for rank in range(4, 8):
        reported = bad.node_benchmark.ranks.add(job_id=job.job_id, rank=rank)
        reported.sizes.extend(agent_pb2.SizeResult(bytes=size, time_us=time_us) for size, time_us in sizes)
    # What the agent session does with a result: record it, then tell the listeners.
    recorded = await jobs_controller.commands.finish("s2", bad)
    await jobs_controller.jobs.on_result("s2", bad, recorded.job_id)
    done = await jobs_controller.jobs.get(job.job_id)
    assert done.status == JobStatus.FAILED
    assert says in done.message
    # The nodes are free again.
    again = await jobs_controller.jobs.start(request(["s1"]))
    assert (await finished(jobs_controller, again.job_id)).status == JobStatus.SUCCEEDED


@pytest.mark.parametrize("bandwidth", [float("nan"), float("inf"), -3.0, 0.0])
async def test_a_probe_figure_no_link_can_have_is_not_stored(
    jobs_controller: Controller, agents: Callable[..., RunningAgent], bandwidth: float
) -> None:
    await _gone_away(jobs_controller, agents("g1", "gloo"), agents("g2", "gloo"))
    started = await jobs_controller.probes.start(
        probe_request_from_proto(admin_pb2.StartProbeRoundRequest(pair_deadline_s=600))
    )
    ids = {"g1": "", "g2": ""}

    async def sent() -> bool:
        for node in ids:
            ids[node] = next((c.id for c in await jobs_controller.commands.outstanding(node)), "")
        return all(ids.values())

    await async_wait_until(sent, what="both probe commands stored")
    # What the agent session does with a result: record it, then tell the listeners.
    for node, peer, figure in (("g1", "g2", 10.0), ("g2", "g1", bandwidth)):
        result = agent_pb2.CommandResult(command_id=ids[node], status=agent_pb2.COMMAND_STATUS_SUCCEEDED)
        result.probe.CopyFrom(agent_pb2.ProbeResult(node_name=node, peer=peer, bandwidth_gbps=figure, latency_us=5.0))
        recorded = await jobs_controller.commands.finish(node, result)
        await jobs_controller.probes.on_result(node, result, recorded.job_id)

    async def done() -> ProbeRound | None:
        found = await jobs_controller.probes.get(started.round_id)
        return found if found.status != ProbeStatus.RUNNING else None

    failed = await async_wait_until(done, what="the probe round")
    assert failed.status == ProbeStatus.FAILED
    assert "g1-g2: g2: " in failed.message and "bandwidth" in failed.message
    assert list(failed.measurements) == []
    assert await jobs_controller.probes.measured_pairs() == []


async def test_a_stopping_agent_kills_the_workers_of_its_running_job(
    jobs_controller: Controller, agents: Callable[..., RunningAgent], tmp_path: Path
) -> None:
    a = agents("a", "gloo")
    await registered(a)
    await _gone_away(jobs_controller, agents("b", "gloo"))
    # Rank 0 waits at the rendezvous for rank 1, whose node is gone, until the deadline.
    job = await jobs_controller.jobs.start(request(["a", "b"], deadline_s=40))
    progress = tmp_path / "a" / "bench" / job.job_id / "rank-0" / "progress.jsonl"

    pid = await async_wait_until(lambda: asyncio.to_thread(_first_pid, progress), timeout=30, what="rank 0 started")
    await asyncio.wait_for(a.shutdown(), 10)
    await async_wait_until(lambda: asyncio.to_thread(process_gone, pid), timeout=10, what=f"rank 0 (pid {pid}) killed")


def _first_pid(progress: Path) -> int:
    """The pid a rank reported as it started (0 before that)."""
    lines = progress.read_text().splitlines() if progress.exists() else []
    return int(json.loads(lines[0])["pid"]) if lines else 0


async def test_a_rank_that_fails_early_ends_the_job_at_once_and_the_others_workers_are_killed(
    jobs_controller: Controller, agents: Callable[..., RunningAgent], tmp_path: Path
) -> None:
    # Node b's gloo cannot bind its address (TEST-NET-1, on no interface here): its rank fails once it has
    # joined the rendezvous (so rank 0, which hosts it, runs by then), and the ranks on a and c would wait
    # for it in gloo's setup until the deadline.
    await registered(agents("a", "gloo"), agents("b", "gloo", address="192.0.2.1"), agents("c", "gloo"))
    job = await jobs_controller.jobs.start(request(["a", "b", "c"], deadline_s=300))

    done = await finished(jobs_controller, job.job_id)
    assert done.status == JobStatus.FAILED, done.message
    assert "node b rank 1 failed: " in done.message and "cancelled on a, c" in done.message, done.message
    assert done.finished_at is not None
    took = done.finished_at - done.created_at
    assert took.total_seconds() < 120, f"ended by the failure, not the {300} s deadline ({took})"
    # At once: the new job waits for a and c to confirm the cancel (their workers reaped), not refused by them.
    again = await jobs_controller.jobs.start(request(["a", "c"]))

    async def cancels_done() -> dict[str, str] | None:
        cancels = [c for c in await jobs_controller.commands.list() if c.kind == "cancel_job"]
        return {c.node_name: c.message for c in cancels} if cancels and all(c.status.final for c in cancels) else None

    messages = await async_wait_until(cancels_done, timeout=20, what="the cancels' results")
    killed = f"job {job.job_id} cancelled: its workers were killed"
    # c's rank may not have started yet when the cancel came: then it never starts.
    assert messages == {"a": killed, "c": messages["c"]}, messages
    assert messages["c"] in (killed, f"job {job.job_id} was not running here; it will not start")
    for name, rank in (("a", 0), ("c", 2)):
        pid = _first_pid(tmp_path / name / "bench" / job.job_id / f"rank-{rank}" / "progress.jsonl")
        assert pid or name == "c", "rank 0 ran: rank 1 joined its rendezvous"
        if pid:
            await async_wait_until(lambda p=pid: asyncio.to_thread(process_gone, p), timeout=20, what=f"{name}'s rank")
    runs = {c.node_name: c for c in await jobs_controller.commands.list() if c.body.run_benchmark.job_id == job.job_id}
    assert runs["a"].status.final and runs["c"].status.final, "neither is sent again"
    after = await finished(jobs_controller, again.job_id)
    assert after.status == JobStatus.SUCCEEDED, after.message


async def test_a_probe_whose_peer_fails_ends_at_once_and_the_other_side_is_cancelled(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    # b's gloo cannot bind its address: its side fails, and a's would wait for it until the pair's deadline.
    await registered(agents("a", "gloo"), agents("b", "gloo", address="192.0.2.1"))
    started = await jobs_controller.probes.start(
        probe_request_from_proto(
            admin_pb2.StartProbeRoundRequest(nodes=["a", "b"], message_bytes=1 << 16, pair_deadline_s=300)
        )
    )

    async def done() -> ProbeRound | None:
        found = await jobs_controller.probes.get(started.round_id)
        return found if found.status != ProbeStatus.RUNNING else None

    failed = await async_wait_until(done, timeout=90, what="the probe round")
    assert failed.status == ProbeStatus.FAILED
    assert "a-b: node b rank 1 failed: " in failed.message, failed.message

    async def cancel_done() -> str | None:
        cancels = [c for c in await jobs_controller.commands.list() if c.kind == "cancel_job"]
        return cancels[0].message if len(cancels) == 1 and cancels[0].status.final else None

    message = await async_wait_until(cancel_done, timeout=20, what="a's cancel")
    assert message.endswith("cancelled: its workers were killed"), message
    assert await jobs_controller.commands.outstanding("a") == []


async def test_a_probe_whose_peer_is_lost_ends_within_the_expiry_and_the_other_side_is_cancelled(
    jobs_controller: Controller, agents: Callable[..., RunningAgent], tmp_path: Path
) -> None:
    jobs_controller.registry.expiry_s = 1.0  # the test clusters' short expiry; the pair's deadline is 300 s
    b = agents("b", "gloo")
    await registered(agents("a", "gloo"), b)
    started = await jobs_controller.probes.start(
        probe_request_from_proto(
            admin_pb2.StartProbeRoundRequest(nodes=["a", "b"], message_bytes=1 << 16, pair_deadline_s=300)
        )
    )
    out = tmp_path / "{}" / "bench" / f"probe-{started.round_id}-0-0-out" / "rank-{}" / "progress.jsonl"
    pid = await async_wait_until(
        lambda: asyncio.to_thread(_first_pid, Path(str(out).format("a", 0))), timeout=60, what="a's rank"
    )
    b_pid = await async_wait_until(
        lambda: asyncio.to_thread(_first_pid, Path(str(out).format("b", 1))), timeout=60, what="b's rank"
    )
    # b drops off the network: its agent answers no more (its heartbeats stop) and its rank is frozen, so a's
    # rank only waits for it, as it would behind a cut cable; nothing reports a failure before b is lost.
    b.agent.executor.stop_benchmarks = lambda: None  # type: ignore[method-assign]
    os.kill(b_pid, signal.SIGSTOP)
    try:
        await b.shutdown()

        async def done() -> ProbeRound | None:
            found = await jobs_controller.probes.get(started.round_id)
            return found if found.status != ProbeStatus.RUNNING else None

        failed = await async_wait_until(done, timeout=30, what="the probe round")
        assert "a-b: node b lost (no heartbeat) while the job ran" in failed.message, failed.message
        await async_wait_until(lambda: asyncio.to_thread(process_gone, pid), timeout=20, what="a's rank killed")
        cancels = {c.node_name: c for c in await jobs_controller.commands.list() if c.kind == "cancel_job"}
        assert sorted(cancels) == ["a", "b"], "b gets its cancel when it comes back"
        assert not cancels["b"].status.final
    finally:
        os.kill(b_pid, signal.SIGKILL)  # what b's cancel would do once it is back


async def test_a_node_that_has_not_confirmed_a_cancel_takes_no_new_job(
    jobs_controller: Controller, agents: Callable[..., RunningAgent]
) -> None:
    # a's agent is away (not yet lost) with a cancel it has not answered: its old workers may still run.
    await _gone_away(jobs_controller, agents("a", "gloo"))
    await jobs_controller.commands.submit("a", cancel_command("bj-old", "node b lost"), command_id="bj-old-cancel-0")
    jobs_controller.jobs.settings = replace(jobs_controller.jobs.settings, cancel_wait_s=0.3)
    with pytest.raises(NodeBusy, match="node a has not yet confirmed that it ended benchmark job bj-old"):
        await jobs_controller.jobs.start(request(["a"]))
    assert await jobs_controller.jobs.list() == [], "nothing stored"

    # A job asked for meanwhile starts when the node confirms the cancel, not when its wait is over.
    jobs_controller.jobs.settings = replace(jobs_controller.jobs.settings, cancel_wait_s=600)
    waiting = asyncio.create_task(jobs_controller.jobs.start(request(["a"])))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    confirmed = agent_pb2.CommandResult(command_id="bj-old-cancel-0", status=agent_pb2.COMMAND_STATUS_SUCCEEDED)
    recorded = await jobs_controller.commands.finish("a", confirmed)  # what the node's session does with it
    await jobs_controller.jobs.on_result("a", confirmed, recorded.job_id)
    started = await asyncio.wait_for(waiting, 30)
    assert started.status is JobStatus.RUNNING


async def test_agents_run_a_later_job_of_the_same_environment_in_their_kept_workers_and_end_them_on_stop(
    jobs_controller: Controller, agents: Callable[..., RunningAgent], tmp_path: Path
) -> None:
    started = [agents(name, "gloo") for name in ("a", "b")]
    await registered(*started)
    pids = []
    for _ in range(2):
        job = await jobs_controller.jobs.start(request(["a", "b"]))
        done = await finished(jobs_controller, job.job_id)
        assert done.status == JobStatus.SUCCEEDED, done.message
        assert all(s.wrong == 0 and s.checked for s in done.sizes)
        pids.append(
            [
                _first_pid(tmp_path / node / "bench" / job.job_id / f"rank-{rank}" / "progress.jsonl")
                for rank, node in enumerate("ab")
            ]
        )
    assert pids[1] == pids[0] and all(pids[0])  # the second job ran in the first one's processes
    for each in started:
        await asyncio.wait_for(each.shutdown(), 30)
    for pid in pids[0]:
        await async_wait_until(lambda p=pid: asyncio.to_thread(process_gone, p), timeout=10, what=f"kept worker {pid}")
