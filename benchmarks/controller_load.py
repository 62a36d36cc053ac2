"""Load benchmark: thousands of simulated agents against one real controller process.

Each simulated agent is a lightweight client (one gRPC stream, no discovery, no journal) that registers
and then heartbeats at the production interval, measuring the round trip of every heartbeat to its
acknowledgement. The controller is the real `topo-tune controller serve` process with SQLite; the load
comes from a separate process (this one), on the same machine.

Usage: python benchmarks/controller_load.py [--agents 1000 5000] [--interval 10] [--duration 40]
Prints one table row per fleet size. Target (Foundation issue): 5,000 agents at one heartbeat per 10 s
with heartbeat p99 < 100 ms and controller RSS < 1 GiB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc.aio

from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import agent_pb2, agent_pb2_grpc

TOKEN = "load-test-token"
STREAMS_PER_CHANNEL = 100


@dataclass
class Stats:
    registered: int = 0
    register_seconds: list[float] = field(default_factory=list)
    rtts: list[float] = field(default_factory=list)
    acked: int = 0
    errors: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def simulated_agent(
    stub: agent_pb2_grpc.AgentServiceStub,
    name: str,
    *,
    interval: float,
    measure_from: float,
    stop_at: float,
    stats: Stats,
    rng: random.Random,
) -> None:
    call = stub.Session(metadata=bearer_metadata(TOKEN))
    started = time.perf_counter()
    register = agent_pb2.Register(node_name=name, backend=agent_pb2.BACKEND_SIM, instance_id=name, agent_version="load")
    register.topology.hostname = name
    try:
        await call.write(agent_pb2.AgentMessage(register=register))
        reply = await call.read()
        if not isinstance(reply, agent_pb2.ControllerMessage) or not reply.HasField("registered"):
            stats.errors += 1
            return
        stats.registered += 1
        stats.register_seconds.append(time.perf_counter() - started)
        await asyncio.sleep(rng.uniform(0, interval))  # spread the fleet over the interval, as jitter does
        seq = 0
        while time.monotonic() < stop_at:
            seq += 1
            sent = time.perf_counter()
            await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq)))
            ack = await call.read()
            if not isinstance(ack, agent_pb2.ControllerMessage) or ack.heartbeat_ack.seq != seq:
                stats.errors += 1
                return
            if time.monotonic() >= measure_from:
                stats.rtts.append(time.perf_counter() - sent)
                stats.acked += 1
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - sent)))
    except grpc.aio.AioRpcError:
        stats.errors += 1
    finally:
        call.cancel()


async def drive(address: str, agents: int, interval: float, duration: float) -> Stats:
    channels = [
        grpc.aio.insecure_channel(address) for _ in range((agents + STREAMS_PER_CHANNEL - 1) // STREAMS_PER_CHANNEL)
    ]
    stubs = [agent_pb2_grpc.AgentServiceStub(c) for c in channels]
    stats = Stats()
    rng = random.Random(0)
    start = time.monotonic()
    ramp = min(20.0, agents / 250)  # registrations arrive over the ramp, not all in one instant
    measure_from = start + ramp + interval
    stop_at = measure_from + duration
    tasks = []
    for i in range(agents):
        tasks.append(
            asyncio.create_task(
                simulated_agent(
                    stubs[i % len(stubs)],
                    f"sim-{i:05d}",
                    interval=interval,
                    measure_from=measure_from,
                    stop_at=stop_at,
                    stats=stats,
                    rng=rng,
                )
            )
        )
        if i % 50 == 49:
            await asyncio.sleep(ramp * 50 / agents)
    await asyncio.gather(*tasks)
    for channel in channels:
        await channel.close()
    return stats


def run(agents: int, interval: float, duration: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="topo-tune-load-") as tmp:
        port = free_port()
        env = {**os.environ, "TOPO_TUNE_TOKEN": TOKEN}
        log = open(f"{tmp}/controller.log", "wb")  # noqa: SIM115 - closed in the finally below
        controller = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "topo_tune",
                "--log-level",
                "warning",
                "controller",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--database",
                f"sqlite:///{tmp}/load.db",
                "--heartbeat-interval",
                str(interval),
                "--heartbeat-expiry",
                str(interval * 3),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            cpu_before = cpu_seconds(controller.pid)
            wall_before = time.monotonic()
            stats = asyncio.run(drive(f"127.0.0.1:{port}", agents, interval, duration))
            cpu = (cpu_seconds(controller.pid) - cpu_before) / (time.monotonic() - wall_before)
            rss = rss_mib(controller.pid)
        finally:
            controller.send_signal(signal.SIGTERM)
            controller.wait(60)
            log.close()
    rtts = sorted(stats.rtts)
    q = statistics.quantiles(rtts, n=100) if len(rtts) >= 100 else [float("nan")] * 99
    return {
        "agents": agents,
        "registered": stats.registered,
        "register_p99_ms": statistics.quantiles(stats.register_seconds, n=100)[98] * 1000
        if stats.registered >= 100
        else float("nan"),
        "heartbeats_per_s": stats.acked / duration,
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "rss_mib": rss,
        "cpu_cores": cpu,
        "errors": stats.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--interval", type=float, default=10.0, help="heartbeat interval, seconds")
    parser.add_argument("--duration", type=float, default=40.0, help="measured steady-state seconds")
    args = parser.parse_args()
    print(
        f"heartbeat interval {args.interval:g} s, {args.duration:g} s measured after ramp-up; "
        f"{os.cpu_count()} CPUs shared by the controller and the load generator"
    )
    header = (
        "| agents | registered | register p99 ms | heartbeats/s | heartbeat p50 ms | heartbeat p99 ms "
        "| controller RSS MiB | controller CPU (cores) | errors |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for agents in args.agents:
        r = run(agents, args.interval, args.duration)
        print(
            f"| {r['agents']:,} | {r['registered']:,} | {r['register_p99_ms']:.1f} | {r['heartbeats_per_s']:.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['rss_mib']:.0f} | {r['cpu_cores']:.2f} | {r['errors']} |",
            flush=True,
        )
    print("target: 5,000 agents, heartbeat p99 < 100 ms, controller RSS < 1,024 MiB")


if __name__ == "__main__":
    main()
