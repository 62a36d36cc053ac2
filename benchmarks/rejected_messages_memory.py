"""Memory benchmark: does a controller that refuses large messages from a token holder keep their bytes?

The real ``topo-tune controller serve`` process (SQLite, loopback) is sent batches of admin calls whose bodies
are 15 to 17 MiB: 15 and 16 MiB config versions, each refused for its content (``INVALID_ARGUMENT``: a file
is larger than 1 MiB), 15 MiB of bytes that are not a request message at all (``INVALID_ARGUMENT``), and
17 MiB ones, over the 16 MiB receive limit (``RESOURCE_EXHAUSTED``). After each batch the controller's
resident memory is read from ``/proc`` once it has settled (the heap keeper trims every 10 s). A
controller that keeps what it refused grows batch after batch; one that does not levels off.

Usage: python benchmarks/rejected_messages_memory.py [--batches 8] [--per-batch 64] [--concurrency 16]
Prints one table row per batch. Target (the fault suite): 1,000 refused 15 MiB messages leave the
controller's RSS within 50 MB of where it started.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import grpc.aio

from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc

TOKEN = "memory-test-token"
MIB = 1024 * 1024
PUT = "/topo_tune.v1.AdminService/PutConfigVersion"


def _rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def _version(size: int) -> bytes:
    return admin_pb2.PutConfigVersionRequest(files={"nccl.conf": "#" * size}).SerializeToString()


KINDS = {
    "15mib": lambda: _version(15 * MIB),
    "16mib": lambda: _version(16 * MIB - 64),
    "undecodable": lambda: b"\xff" * (15 * MIB),
    "17mib": lambda: _version(17 * MIB),
}
"""The refused bodies; a batch sends those asked for in turn."""


async def _batch(address: str, *, count: int, concurrency: int, bodies: list[bytes]) -> collections.Counter[str]:
    codes: collections.Counter[str] = collections.Counter()
    limit = asyncio.Semaphore(concurrency)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        call = channel.unary_unary(PUT, request_serializer=None, response_deserializer=None)

        async def one(index: int) -> None:
            async with limit:
                try:
                    await call(bodies[index % len(bodies)], metadata=bearer_metadata(TOKEN), timeout=120)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as error:
                    codes[error.code().name] += 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return codes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_serving(address: str, process: subprocess.Popen[bytes]) -> None:
    async def ask() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            await stub.ListNodes(admin_pb2.ListNodesRequest(), metadata=bearer_metadata(TOKEN), timeout=2)

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the controller exited")
        try:
            asyncio.run(ask())
            return
        except grpc.aio.AioRpcError:
            time.sleep(0.2)
    raise RuntimeError("the controller did not serve within 60 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--per-batch", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    # The heap keeper gives freed memory back every 10 s: read RSS after that.
    parser.add_argument("--settle", type=float, default=11.0, help="seconds to wait before reading RSS")
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=list(KINDS))
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for the controller (e.g. MALLOC_ARENA_MAX=2)")
    args = parser.parse_args()
    bodies = [KINDS[kind]() for kind in args.kinds]
    env = {"TOPO_TUNE_TOKEN": TOKEN, "PATH": "", **dict(e.split("=", 1) for e in args.env)}
    with tempfile.TemporaryDirectory() as workdir, Path(workdir, "controller.log").open("wb") as log:
        address = f"127.0.0.1:{_free_port()}"
        command = [sys.executable, "-m", "topo_tune", "controller", "serve", "--listen", address]
        command += ["--database", f"sqlite:///{workdir}/db.sqlite"]
        process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        try:
            _run(args, address, process.pid, bodies, lambda: _wait_serving(address, process))
        finally:
            process.terminate()
            process.wait(30)


def _run(args: argparse.Namespace, address: str, pid: int, bodies: list[bytes], ready: Callable[[], None]) -> None:
    ready()
    time.sleep(args.settle)
    start = _rss_mib(pid)
    print(
        f"controller RSS at start: {start:.0f} MiB; {args.per_batch} calls a batch, {args.concurrency} at "
        f"once, bodies: {', '.join(args.kinds)}; RSS read {args.settle:g} s after each batch"
    )
    print("| batch | calls so far | codes (this batch) | RSS MiB | RSS - start MiB | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    sent = 0
    for batch in range(1, args.batches + 1):
        codes = asyncio.run(_batch(address, count=args.per_batch, concurrency=args.concurrency, bodies=bodies))
        sent += args.per_batch
        time.sleep(args.settle)
        rss, peak = _rss_mib(pid), _rss_mib(pid, "VmHWM")
        shown = ", ".join(f"{name} {n}" for name, n in sorted(codes.items()))
        print(f"| {batch} | {sent:,} | {shown} | {rss:.0f} | {rss - start:+.0f} | {peak:.0f} |", flush=True)


if __name__ == "__main__":
    main()
