"""Load over a real network hop: thousands of simulated agent sessions against one controller.

The controller is the real ``topo-tune controller serve`` process in its own network namespace (SQLite);
the load generator is a separate process in a host namespace of the same namespace cluster, so every
message crosses a veth link and the kernel's routing, not loopback. One simulated agent is one gRPC
stream (no discovery, no journal) that registers, heartbeats at the production interval and answers the
commands it is sent. Three phases, one table row per fleet size:

1. registration burst: every agent registers at once; registrations per second over the burst and the
   p99 of one registration's round trip;
2. steady heartbeats: the round trip of each heartbeat to its acknowledgement (p50, p99) over the
   measured window, and the controller's CPU (cores) over that window;
3. command fan-out: one admin ``SendCommands`` request sends a ``rediscover`` to every node; the time
   until every agent holds its command and until every result is acknowledged (committed) by the
   controller.

The controller's RSS is its peak (VmHWM) over the run. The generator shares the cores with the controller, so
it reports its own event loop's worst lag over the steady window too (a heartbeat's round trip includes it),
and keeps its own cyclic garbage collector off (a run is short), so that its own collections over the fleet
do not pace the burst or stall the measurement. The
machine's load average when each row starts is printed with it: numbers taken on a busy machine are not
the targets' numbers. Needs root (it builds namespaces).

Usage: python benchmarks/netns_load.py [--agents 1000 5000] [--interval 10] [--duration 30]
Targets: 5,000 agents at one heartbeat per 10 s, heartbeat p99 < 100 ms, controller RSS < 1 GiB, fan-out
to 5,000 agents fully acknowledged in < 5 s; 20,000 agents: heartbeat p99 < 100 ms, controller RSS < 1 GiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc.aio

from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
STREAMS_PER_CHANNEL = 100
REGISTRATIONS_IN_FLIGHT = 500
"""A fleet restarting at once still dials in through a bounded number of connections' worth of streams."""
REGISTER_TIMEOUT_S = 60.0
FANOUT_TIMEOUT_S = 120.0
Metadata = tuple[tuple[str, str], ...]
Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ControllerMessage]


@dataclass
class Fleet:
    """What the generator measured; times are ``time.perf_counter()`` seconds."""

    register_s: list[float] = field(default_factory=list)
    registered_at: list[float] = field(default_factory=list)
    rtts: list[float] = field(default_factory=list)
    loop_lags: list[float] = field(default_factory=list)
    """How late the generator's own event loop woke a 10 ms sleep, over the steady window."""
    command_at: dict[str, float] = field(default_factory=dict)
    result_acked_at: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    measuring: bool = False
    agents: int = 0
    burst_over: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every agent has registered or given up."""
    expected: int = 0
    all_acked: asyncio.Event = field(default_factory=asyncio.Event)

    def settle(self) -> None:
        if len(self.registered_at) + self.errors == self.agents:
            self.burst_over.set()


class SimulatedAgent:
    """One agent session: a reader that answers commands and matches heartbeat acks to their sends."""

    def __init__(self, name: str, stub: agent_pb2_grpc.AgentServiceStub, metadata: Metadata, fleet: Fleet) -> None:
        self.name = name
        self._stub = stub
        self._metadata = metadata
        self._call: Call | None = None
        self._fleet = fleet
        self._write_lock = asyncio.Lock()
        self._heartbeats: dict[int, float] = {}
        self.registered = False

    @property
    def call(self) -> Call:
        assert self._call is not None, "register first"
        return self._call

    async def _write(self, message: agent_pb2.AgentMessage) -> None:
        async with self._write_lock:  # one outstanding write per stream
            await self.call.write(message)

    async def register(self) -> bool:
        register = agent_pb2.Register(
            node_name=self.name, backend=agent_pb2.BACKEND_SIM, instance_id=self.name, agent_version="load"
        )
        register.topology.hostname = self.name
        started = time.perf_counter()
        self._call = self._stub.Session(metadata=self._metadata)  # the stream opens with the registration
        await self._write(agent_pb2.AgentMessage(register=register))
        reply = await self.call.read()
        if not isinstance(reply, agent_pb2.ControllerMessage) or not reply.HasField("registered"):
            return False
        self.registered = True
        now = time.perf_counter()
        self._fleet.register_s.append(now - started)
        self._fleet.registered_at.append(now)
        return True

    async def read(self) -> None:
        while True:
            message = await self.call.read()
            if not isinstance(message, agent_pb2.ControllerMessage):
                return
            kind = message.WhichOneof("kind")
            if kind == "heartbeat_ack":
                sent = self._heartbeats.pop(message.heartbeat_ack.seq, None)
                if sent is not None and self._fleet.measuring:
                    self._fleet.rtts.append(time.perf_counter() - sent)
            elif kind == "command":
                self._fleet.command_at[self.name] = time.perf_counter()
                asyncio.create_task(self._answer(message.command))  # noqa: RUF006 - the session outlives it
            elif kind == "result_ack":
                self._fleet.result_acked_at[self.name] = time.perf_counter()
                if len(self._fleet.result_acked_at) == self._fleet.expected:
                    self._fleet.all_acked.set()

    async def _answer(self, command: agent_pb2.Command) -> None:
        await self._write(agent_pb2.AgentMessage(ack=agent_pb2.CommandAck(command_id=command.command_id)))
        result = agent_pb2.CommandResult(
            command_id=command.command_id, status=agent_pb2.COMMAND_STATUS_SUCCEEDED, message="simulated"
        )
        result.topology.hostname = self.name
        result.finished_at.GetCurrentTime()
        await self._write(agent_pb2.AgentMessage(result=result))

    async def heartbeat(self, interval: float, rng: random.Random) -> None:
        await asyncio.sleep(rng.uniform(0, interval))  # spread the fleet over the interval, as jitter does
        seq = 0
        while True:
            seq += 1
            self._heartbeats[seq] = time.perf_counter()
            await self._write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq)))
            await asyncio.sleep(interval * rng.uniform(0.9, 1.1))


def quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 100 else float("nan")


def phase(name: str) -> None:
    """Tell the parent process (which samples the controller's CPU) where the generator is."""
    print(json.dumps({"phase": name}), flush=True)


async def generate(address: str, token: str, agents: int, interval: float, duration: float) -> dict[str, Any]:
    metadata = bearer_metadata(token)
    channels = [grpc.aio.insecure_channel(address) for _ in range(-(-agents // STREAMS_PER_CHANNEL))]
    stubs = [agent_pb2_grpc.AgentServiceStub(channel) for channel in channels]
    fleet = Fleet(agents=agents)
    rng = random.Random(0)
    sims = [SimulatedAgent(f"sim-{i:05d}", stubs[i % len(stubs)], metadata, fleet) for i in range(agents)]

    burst_started = time.perf_counter()
    limit = asyncio.Semaphore(REGISTRATIONS_IN_FLIGHT)

    async def live(sim: SimulatedAgent) -> None:
        """Register (the burst), then read and heartbeat like an agent does, until cancelled."""
        async with limit:
            try:
                registered = await asyncio.wait_for(sim.register(), REGISTER_TIMEOUT_S)
            except (TimeoutError, grpc.aio.AioRpcError):
                registered = False
        if not registered:
            fleet.errors += 1
        fleet.settle()
        if registered:
            await asyncio.gather(sim.read(), sim.heartbeat(interval, rng))

    gc.disable()  # the generator's own collections over its fleet would pace the burst and stall heartbeats
    tasks = [asyncio.create_task(live(sim)) for sim in sims]
    await fleet.burst_over.wait()
    burst_s = max(fleet.registered_at, default=burst_started) - burst_started

    await asyncio.sleep(interval)  # every agent has started heartbeating
    phase("steady")
    fleet.measuring = True
    steady_ends = time.perf_counter() + duration
    while (now := time.perf_counter()) < steady_ends:
        await asyncio.sleep(0.01)
        fleet.loop_lags.append(time.perf_counter() - now - 0.01)
    fleet.measuring = False
    phase("fan-out")

    admin = admin_pb2_grpc.AdminServiceStub(channels[0])
    names = [sim.name for sim in sims if sim.registered]
    fleet.expected = len(names)
    fanout_started = time.perf_counter()
    # One fan-out request: the controller stores every command in one transaction and sends them concurrently.
    request = admin_pb2.SendCommandsRequest(node_names=names, rediscover=agent_pb2.Rediscover())
    fanout_error = ""
    try:
        await admin.SendCommands(request, metadata=metadata, timeout=FANOUT_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:  # the row still shows the steady phase; the failure is named under it
        fanout_error = f"{error.code().name}: {error.details()}"
    all_sent = time.perf_counter() - fanout_started if not fanout_error else float("nan")
    if not fanout_error:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fleet.all_acked.wait(), FANOUT_TIMEOUT_S)  # missing results count as errors
    phase("done")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()

    delivered = sorted(t - fanout_started for t in fleet.command_at.values())
    succeeded = sorted(t - fanout_started for t in fleet.result_acked_at.values())
    return {
        "agents": agents,
        "registered": len(fleet.registered_at),
        "registrations_per_s": len(fleet.registered_at) / burst_s if burst_s else float("nan"),
        "register_p99_ms": quantile(fleet.register_s, 99) * 1000,
        "heartbeats_per_s": len(fleet.rtts) / duration,
        "heartbeat_p50_ms": quantile(fleet.rtts, 50) * 1000,
        "heartbeat_p99_ms": quantile(fleet.rtts, 99) * 1000,
        "generator_lag_max_ms": max(fleet.loop_lags, default=float("nan")) * 1000,
        "fanout_sent_s": all_sent,
        "fanout_delivered_p50_s": statistics.median(delivered) if delivered else float("nan"),
        "fanout_all_delivered_s": delivered[-1] if len(delivered) == fleet.expected else float("nan"),
        "fanout_all_succeeded_s": succeeded[-1] if len(succeeded) == fleet.expected else float("nan"),
        "fanout_99_succeeded_s": succeeded[int(0.99 * len(succeeded)) - 1] if succeeded else float("nan"),
        "errors": fleet.errors + len(fleet.registered_at) - len(succeeded),
        "fanout_error": fanout_error,
    }


def _proc(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(agents: int, interval: float, duration: float, *, keep_logs: Path | None = None) -> dict[str, Any]:
    """One fleet size on a fresh namespace cluster: the controller's namespace and one for the fleet."""
    sys.path.insert(0, str(ROOT))
    from tests.support.netns import ClusterShape, NetnsCluster
    from tests.support.processes import TOKEN

    with tempfile.TemporaryDirectory(prefix="topo-tune-netns-load-") as tmp:
        cluster = NetnsCluster(
            ClusterShape(racks={"load": ["fleet"]}),
            Path(tmp),
            heartbeat_interval=interval,
            heartbeat_expiry=interval * 3,
        )
        with cluster:
            controller = cluster.start_controller(f"sqlite:///{tmp}/load.db")
            assert controller.process is not None
            pid = controller.process.pid  # `ip netns exec` execs: this is the controller itself
            argv = [sys.executable, __file__, "--generate", cluster.controller_address, "--token", TOKEN]
            argv += ["--agents", str(agents), "--interval", str(interval), "--duration", str(duration)]
            generator = cluster.popen_in("fleet", argv, cwd=ROOT)
            assert generator.stdout is not None
            cpu: dict[str, float] = {}
            result: dict[str, Any] = {}
            for line in generator.stdout:
                message = json.loads(line)
                if "phase" in message:
                    cpu[message["phase"]] = _cpu_seconds(pid)
                    cpu[message["phase"] + "-at"] = time.monotonic()
                else:
                    result = message
            if generator.wait() != 0 or not result:
                raise RuntimeError(f"the load generator failed: {generator.stderr.read() if generator.stderr else ''}")
            result["cpu_cores"] = (cpu["fan-out"] - cpu["steady"]) / (cpu["fan-out-at"] - cpu["steady-at"])
            result["rss_peak_mib"] = _proc(pid, "VmHWM")
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(tmp) / "controller.log", keep_logs / f"controller-{agents}.log")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--interval", type=float, default=10.0, help="heartbeat interval, seconds")
    parser.add_argument("--duration", type=float, default=30.0, help="measured steady-state seconds")
    parser.add_argument("--keep-logs", metavar="DIR", type=Path, help="copy the controller's log of each run here")
    parser.add_argument("--generate", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        (agents,) = args.agents
        report = asyncio.run(generate(args.generate, args.token, agents, args.interval, args.duration))
        print(json.dumps(report), flush=True)
        return
    print(
        f"controller and load generator in two network namespaces joined by a veth link; heartbeat every "
        f"{args.interval:g} s, {args.duration:g} s measured; {os.cpu_count()} CPUs shared by both"
    )
    header = (
        "| agents | registered | registrations/s | register p99 ms | heartbeats/s | heartbeat p50 ms "
        "| heartbeat p99 ms | generator loop lag max ms | fan-out: all sent s | fan-out: all delivered s "
        "| fan-out: 99 % succeeded s | fan-out: all succeeded s | controller CPU (cores) | controller peak RSS MiB "
        "| errors | load avg at start |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for agents in args.agents:
        load = os.getloadavg()[0]
        r = run(agents, args.interval, args.duration, keep_logs=args.keep_logs)
        print(
            f"| {r['agents']:,} | {r['registered']:,} | {r['registrations_per_s']:.0f} | {r['register_p99_ms']:.0f} "
            f"| {r['heartbeats_per_s']:.0f} | {r['heartbeat_p50_ms']:.1f} | {r['heartbeat_p99_ms']:.1f} "
            f"| {r['generator_lag_max_ms']:.0f} | {r['fanout_sent_s']:.2f} | {r['fanout_all_delivered_s']:.2f} "
            f"| {r['fanout_99_succeeded_s']:.2f} | {r['fanout_all_succeeded_s']:.2f} | {r['cpu_cores']:.2f} "
            f"| {r['rss_peak_mib']:.0f} | {r['errors']} | {load:.1f} |",
            flush=True,
        )
        if r["fanout_error"]:
            print(f"{r['agents']:,} agents: the fan-out request failed: {r['fanout_error']}", flush=True)
    print(
        "targets: heartbeat p99 < 100 ms and controller RSS < 1,024 MiB (5,000 and 20,000 agents); "
        "fan-out to 5,000 agents all succeeded < 5 s"
    )


if __name__ == "__main__":
    main()
