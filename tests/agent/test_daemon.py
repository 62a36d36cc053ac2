"""The agent daemon against a real controller on loopback: registration, delivery, at-most-once execution."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import controller_settings
from tests.support.processes import TOKEN
from tests.support.waiting import async_wait_until
from topo_tune.agent.daemon import Agent
from topo_tune.agent.journal import Journal
from topo_tune.agent.settings import AgentSettings
from topo_tune.command_record import CommandStatus
from topo_tune.controller.server import Controller
from topo_tune.nccl.backends import Backend
from topo_tune.node_record import NodeState
from topo_tune.v1 import agent_pb2, topology_pb2


@dataclass
class CountingDiscovery:
    """Discovery that counts its calls and can be held until released (to keep a command running)."""

    calls: int = 0
    hold: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.hold.set()

    def __call__(self) -> topology_pb2.NodeTopology:
        self.calls += 1
        self.hold.wait(30)
        return topology_pb2.NodeTopology(hostname=f"call-{self.calls}", cpu_count=4)


@dataclass
class RunningAgent:
    agent: Agent
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def shutdown(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 30)


def agent_settings(address: str, state_dir: Path, name: str = "n1") -> AgentSettings:
    return AgentSettings(
        controller=address,
        node_name=name,
        token=TOKEN,
        backend=Backend.SIM,
        state_dir=state_dir,
        config_dir=state_dir / "config",
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )


@pytest.fixture
async def start_agent(tmp_path: Path) -> AsyncIterator[Callable[..., RunningAgent]]:
    """Start in-process agents; whatever a test leaves running is stopped afterwards."""
    started: list[RunningAgent] = []

    def start(address: str, discovery: CountingDiscovery, name: str = "n1") -> RunningAgent:
        agent = Agent(agent_settings(address, tmp_path / name, name), discover=discovery, rng=random.Random(1))
        stop = asyncio.Event()
        running = RunningAgent(agent, stop, asyncio.create_task(agent.run(stop)))
        started.append(running)
        return running

    yield start
    for running in started:
        if not running.task.done():
            with contextlib.suppress(Exception):
                await running.shutdown()


def address(controller: Controller) -> str:
    return f"127.0.0.1:{controller.port}"


async def test_registers_and_heartbeats(controller: Controller, start_agent: Callable[..., RunningAgent]) -> None:
    running = start_agent(address(controller), CountingDiscovery())
    await asyncio.wait_for(running.agent.registered.wait(), 20)
    node = await controller.registry.get("n1")
    assert node.state is NodeState.READY
    assert topology_pb2.NodeTopology.FromString(node.topology).hostname == "call-1"
    await async_wait_until(lambda: _heartbeats(controller), what="a heartbeat")
    await running.shutdown()


async def _heartbeats(controller: Controller) -> bool:
    return controller.metrics.heartbeats._value.get() > 0


async def test_command_sent_while_disconnected_runs_once_after_reconnect(
    controller: Controller, start_agent: Callable[..., RunningAgent]
) -> None:
    discovery = CountingDiscovery()
    first = start_agent(address(controller), discovery)
    await asyncio.wait_for(first.agent.registered.wait(), 20)
    await first.shutdown()
    await async_wait_until(lambda: _disconnected(controller), what="the session to close")

    record = await controller.commands.submit("n1", agent_pb2.Command(rediscover=agent_pb2.Rediscover()))
    assert record.status is CommandStatus.PENDING
    assert not await controller.hub.deliver_new(record), "nobody to deliver to while the agent is away"
    calls_before = discovery.calls

    second = start_agent(address(controller), discovery)
    done = await async_wait_until(lambda: _finished(controller, record.id), what="the command to finish")
    assert done.status is CommandStatus.SUCCEEDED
    assert done.deliveries == 1
    assert discovery.calls == calls_before + 2, "one discovery at start-up, one for the command"
    assert done.result is not None and done.result.topology.hostname == f"call-{discovery.calls}"
    await second.shutdown()


async def _disconnected(controller: Controller) -> bool:
    return not controller.hub.connected("n1")


async def _finished(controller: Controller, command_id: str) -> object:
    record = await controller.commands.get(command_id)
    return record if record.status.final else None


async def test_a_command_taken_just_as_the_session_breaks_still_runs_once(
    controller: Controller, start_agent: Callable[..., RunningAgent], monkeypatch: pytest.MonkeyPatch
) -> None:
    discovery = CountingDiscovery()
    running = start_agent(address(controller), discovery)
    await asyncio.wait_for(running.agent.registered.wait(), 20)
    loop = asyncio.get_running_loop()
    journal = running.agent.journal
    real_take = journal.take
    broken = threading.Event()

    def take_as_the_session_breaks(command_id: str) -> object:
        taken = real_take(command_id)  # the journal records the command as taken ...
        if not broken.is_set():  # ... and the network blinks before the agent acts on it
            broken.set()
            loop.call_soon_threadsafe(controller.hub.close_all, "the network blinked")
            time.sleep(1.0)  # the agent's session ends meanwhile (its next heartbeat finds the stream gone)
        return taken

    monkeypatch.setattr(journal, "take", take_as_the_session_breaks)
    calls_before = discovery.calls
    record = await controller.commands.submit("n1", agent_pb2.Command(rediscover=agent_pb2.Rediscover()))
    await controller.hub.deliver_new(record)
    done = await async_wait_until(lambda: _finished(controller, record.id), what="the command to finish")
    assert done.status is CommandStatus.SUCCEEDED, "taken means run, even when the session ended meanwhile"
    assert discovery.calls == calls_before + 1, "and run once, though the controller sent it again"
    await running.shutdown()


async def test_a_command_running_across_a_controller_restart_runs_once(
    sqlite_url: str, start_agent: Callable[..., RunningAgent]
) -> None:
    first_controller = Controller(controller_settings(sqlite_url))
    await first_controller.start()
    port = first_controller.port
    discovery = CountingDiscovery()
    running = start_agent(f"127.0.0.1:{port}", discovery)
    await asyncio.wait_for(running.agent.registered.wait(), 20)

    discovery.hold.clear()  # the next discovery blocks: the command stays running
    record = await first_controller.commands.submit("n1", agent_pb2.Command(rediscover=agent_pb2.Rediscover()))
    await first_controller.hub.deliver_new(record)
    await async_wait_until(lambda: _status_is(first_controller, record.id, CommandStatus.ACKED), what="ack")
    await first_controller.stop()

    second_controller = Controller(controller_settings(sqlite_url, listen=f"127.0.0.1:{port}"))
    await second_controller.start()
    try:
        await async_wait_until(lambda: _delivered_twice(second_controller, record.id), what="re-delivery")
        discovery.hold.set()
        done = await async_wait_until(lambda: _finished(second_controller, record.id), what="the result")
        assert done.status is CommandStatus.SUCCEEDED
        assert discovery.calls == 2, "re-delivery after the restart must not run the command again"
        nodes = await second_controller.registry.list()
        assert [(n.name, n.registrations) for n in nodes] == [("n1", 2)]
        assert len(await second_controller.commands.list()) == 1
        await running.shutdown()
    finally:
        discovery.hold.set()
        await second_controller.stop()


async def _status_is(controller: Controller, command_id: str, status: CommandStatus) -> bool:
    return (await controller.commands.get(command_id)).status is status


async def _delivered_twice(controller: Controller, command_id: str) -> bool:
    return (await controller.commands.get(command_id)).deliveries >= 2


async def test_a_result_finished_while_the_controller_is_away_is_delivered_later(
    sqlite_url: str, start_agent: Callable[..., RunningAgent]
) -> None:
    first_controller = Controller(controller_settings(sqlite_url))
    await first_controller.start()
    port = first_controller.port
    discovery = CountingDiscovery()
    running = start_agent(f"127.0.0.1:{port}", discovery)
    await asyncio.wait_for(running.agent.registered.wait(), 20)
    discovery.hold.clear()
    record = await first_controller.commands.submit("n1", agent_pb2.Command(rediscover=agent_pb2.Rediscover()))
    await first_controller.hub.deliver_new(record)
    await async_wait_until(lambda: _status_is(first_controller, record.id, CommandStatus.ACKED), what="ack")
    await first_controller.stop()
    discovery.hold.set()  # finishes while no controller is there
    journal_results = await async_wait_until(lambda: _undelivered(running.agent), what="result in the journal")
    assert [r.command_id for r in journal_results] == [record.id]
    await running.shutdown()  # and the agent restarts too

    second_controller = Controller(controller_settings(sqlite_url, listen=f"127.0.0.1:{port}"))
    await second_controller.start()
    try:
        restarted = start_agent(f"127.0.0.1:{port}", discovery)
        done = await async_wait_until(lambda: _finished(second_controller, record.id), what="the result")
        assert done.status is CommandStatus.SUCCEEDED
        assert discovery.calls == 3, "start-up, the command, the second start-up: never the command twice"
        await restarted.shutdown()
    finally:
        await second_controller.stop()


async def _undelivered(agent: Agent) -> list[agent_pb2.CommandResult]:
    return await asyncio.to_thread(agent.journal.undelivered)


async def test_an_interrupted_command_is_reported_failed_not_rerun(
    controller: Controller, start_agent: Callable[..., RunningAgent], tmp_path: Path
) -> None:
    discovery = CountingDiscovery()
    first = start_agent(address(controller), discovery)
    await asyncio.wait_for(first.agent.registered.wait(), 20)
    await first.shutdown()
    record = await controller.commands.submit("n1", agent_pb2.Command(rediscover=agent_pb2.Rediscover()))
    # As if an agent process had taken the command and then been SIGKILLed.
    journal = Journal(tmp_path / "n1" / "journal.sqlite3")
    journal.take(record.id)
    journal.close()
    restarted = start_agent(address(controller), discovery)
    done = await async_wait_until(lambda: _finished(controller, record.id), what="the result")
    assert done.status is CommandStatus.FAILED
    assert "restarted while this command ran" in done.message
    assert discovery.calls == 2, "two start-ups; the interrupted command is not run again"
    await restarted.shutdown()


async def test_drain_is_remembered_across_restarts(
    controller: Controller, start_agent: Callable[..., RunningAgent]
) -> None:
    running = start_agent(address(controller), CountingDiscovery())
    await asyncio.wait_for(running.agent.registered.wait(), 20)
    record = await controller.commands.submit("n1", agent_pb2.Command(drain=agent_pb2.Drain(drained=True)))
    await controller.hub.deliver_new(record)
    await async_wait_until(lambda: _finished(controller, record.id), what="drain")
    bench = await controller.commands.submit("n1", agent_pb2.Command(run_benchmark=agent_pb2.RunBenchmark()))
    await controller.hub.deliver_new(bench)
    refused = await async_wait_until(lambda: _finished(controller, bench.id), what="refusal")
    assert refused.status is CommandStatus.REJECTED
    assert "drained" in refused.message
    await running.shutdown()
    again = start_agent(address(controller), CountingDiscovery())
    await asyncio.wait_for(again.agent.registered.wait(), 20)
    assert (await controller.registry.get("n1")).drained is True
    await again.shutdown()


async def test_a_result_with_a_huge_message_is_delivered_and_the_session_stays_up(
    controller: Controller, start_agent: Callable[..., RunningAgent]
) -> None:
    # A misbehaving controller sends thousands of refused variables: the refusal names every one of them,
    # far more text than the controller accepts in a result, which it would refuse on every re-send.
    running = start_agent(address(controller), CountingDiscovery())
    await asyncio.wait_for(running.agent.registered.wait(), 20)
    run = agent_pb2.RunBenchmark(
        job_id="huge-1",
        collective=agent_pb2.COLLECTIVE_ALL_REDUCE,
        sizes=agent_pb2.SizeSweep(min_bytes=1024, max_bytes=1024),
        iters=1,
        world_size=1,
        ranks=[agent_pb2.RankPlacement(rank=0, node_name="n1")],
        rendezvous_host="127.0.0.1",
        rendezvous_port=29500,
        env={f"NOT_ALLOWED_{i}": "1" for i in range(3000)},
    )
    record = await controller.commands.submit("n1", agent_pb2.Command(run_benchmark=run))
    await controller.hub.deliver_new(record)
    done = await async_wait_until(lambda: _finished(controller, record.id), timeout=10, what="the refusal")
    assert done.status is CommandStatus.REJECTED
    assert done.message.startswith("benchmark env refused: NOT_ALLOWED_0: not allow-listed")
    assert "characters left out" in done.message and len(done.message) <= 16 * 1024
    assert running.agent.sessions == 1, "the session was never torn down over it"
    await running.shutdown()


@pytest.mark.parametrize(
    "error",
    [asyncio.InvalidStateError("RPC already finished"), RuntimeError("boom"), KeyError("kind")],
    ids=["rpc-already-finished", "runtime-error", "key-error"],
)
async def test_any_exception_of_a_session_ends_that_session_only(
    controller: Controller,
    start_agent: Callable[..., RunningAgent],
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    # grpc raises InvalidStateError from a write on a stream the controller's death already finished; any
    # other surprise from a session task must end the same way: that session, not the agent.
    raised: list[Exception] = []
    write_loop = Agent._write_loop

    async def failing_once(self: Agent, call: object, outgoing: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
        if not raised:
            raised.append(error)
            raise error
        await write_loop(self, call, outgoing)  # type: ignore[arg-type]

    monkeypatch.setattr(Agent, "_write_loop", failing_once)
    running = start_agent(address(controller), CountingDiscovery())

    async def registered_again() -> bool:
        return running.agent.sessions >= 2 and running.agent.registered.is_set()

    await async_wait_until(registered_again, what="a second session after the error")
    assert raised == [error]
    assert not running.task.done()
    await running.shutdown()


async def test_the_token_file_is_read_again_at_every_session(controller: Controller, tmp_path: Path) -> None:
    # A Kubernetes projected token is rotated in place by kubelet: a reconnect must present the new one.
    token_file = tmp_path / "token"
    token_file.write_text("expired-token\n")
    settings = dataclasses.replace(
        agent_settings(address(controller), tmp_path / "n1"), token="expired-token", token_file=token_file
    )
    agent = Agent(settings, discover=CountingDiscovery(), rng=random.Random(1))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.sleep(0.5)  # several refused attempts
        assert agent.sessions == 0
        token_file.write_text(f"{TOKEN}\n")
        await asyncio.wait_for(agent.registered.wait(), 20)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
