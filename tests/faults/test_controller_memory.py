"""1,000 rejected 15 MiB messages leave the controller's resident memory within 50 MB of where it started.

The messages are the ones a hostile caller can send: with a valid admin token but a body the controller refuses
(a 15 MiB ``nccl.conf``, over the 1 MiB a version's file may hold), and without a token at all. Each is
refused; none may leave memory behind, so a stream of them cannot grow the controller until it is killed.
The controller refuses the token holder's body by its length, before parsing it (``request_decoding.py``), and
gives back what gRPC received it into once its resident set has grown (``heap.py``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from tests.faults.figures import record
from tests.support.processes import TOKEN, Daemon, free_port, run_cli
from tests.support.waiting import STARTUP_TIMEOUT_S, wait_until
from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import admin_pb2, admin_pb2_grpc

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # 15 GB through the controller: under a minute here

MESSAGES = 1000
CONCURRENT = 8
BODY = 15 * 1024 * 1024
BOUND_MB = 50.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise AssertionError("no VmRSS")


async def _send(address: str, count: int) -> dict[grpc.StatusCode, int]:
    request = admin_pb2.PutConfigVersionRequest(files={"nccl.conf": "#" * BODY})
    codes: dict[grpc.StatusCode, int] = {}
    kinds = [bearer_metadata(TOKEN), None]  # a token holder's refused body, and no token at all
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", -1)]) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        sent = 0

        async def one(metadata: tuple[tuple[str, str], ...] | None) -> None:
            try:
                await stub.PutConfigVersion(request, metadata=metadata, timeout=120)
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                code = error.code()
            codes[code] = codes.get(code, 0) + 1

        while sent < count:
            batch = min(CONCURRENT, count - sent)
            await asyncio.gather(*(one(kinds[(sent + i) % len(kinds)]) for i in range(batch)))
            sent += batch
    return codes


def test_a_thousand_rejected_15_mib_messages_leave_the_controller_rss_where_it_was(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    args = ["controller", "serve", "--listen", address, "--database", f"sqlite:///{tmp_path / 'db.sqlite'}"]
    controller = Daemon(args, tmp_path / "controller.log").start()
    try:
        wait_until(
            lambda: run_cli("admin", "nodes", "--controller", address).returncode == 0,
            timeout=STARTUP_TIMEOUT_S,
            what="serving",
        )
        assert controller.process is not None
        pid = controller.process.pid
        before = rss_mb(pid)
        codes = asyncio.run(_send(address, MESSAGES))
        assert codes == {
            grpc.StatusCode.INVALID_ARGUMENT: MESSAGES // 2,
            grpc.StatusCode.UNAUTHENTICATED: MESSAGES // 2,
        }, codes
        # Settled: the heap keeper hands freed memory back within a second of 32 MiB growth, and every 10 s.
        seen = [rss_mb(pid)]

        def within() -> bool:
            seen.append(rss_mb(pid))
            return seen[-1] - before < BOUND_MB

        try:
            wait_until(within, timeout=30, interval=1.0, what="RSS to settle within the bound")
        except AssertionError:
            raise AssertionError(
                f"RSS {before:.0f} MB before, {seen[-1]:.0f} MB 30 s after {MESSAGES} messages"
            ) from None
        assert run_cli("admin", "nodes", "--controller", address).returncode == 0, "the controller still serves"
        record(
            "1,000 rejected 15 MiB messages",
            faults=MESSAGES,
            resumes=0,
            rows=MESSAGES,
            measured=f"RSS {before:.0f} MB before, {max(seen):.0f} MB at most after, {seen[-1]:.0f} MB settled",
        )
    finally:
        controller.kill()
