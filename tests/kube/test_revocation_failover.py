"""A credential revoked on the leader is refused by the standby that takes over, while others still work.

Two real controllers electing on the fake API server's Lease and sharing one SQLite database; the revocation
goes through the real CLI to the leader, then the leader stops and the standby (running all along, so it never
loaded anything at start-up) becomes the leader.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import grpc.aio

from tests.controller.test_services import expect_status, open_session, register
from tests.kube.test_controller_leadership import pair, the_leader  # noqa: F401
from tests.support.processes import cli_env, run_cli
from topo_tune.controller.server import Controller


async def _cli(address: str, *args: str) -> str:
    done = await asyncio.to_thread(run_cli, *args, env=cli_env(TOPO_TUNE_CONTROLLER=address))
    assert done.returncode == 0, done.stderr
    return done.stdout


async def _issue(address: str, node: str) -> dict[str, str]:
    out = await _cli(address, "admin", "credential", "issue", "--node", node, "-o", "json")
    issued: dict[str, str] = json.loads(out)
    return issued


async def test_a_credential_revoked_on_the_leader_is_refused_by_the_next_leader(
    pair: dict[str, Controller],  # noqa: F811
) -> None:
    problems: list[str] = []
    old = await the_leader(pair, never_two=problems)
    standby = next(c for c in pair.values() if c is not old)
    address = f"127.0.0.1:{old.port}"
    revoked, kept = await _issue(address, "n1"), await _issue(address, "n2")
    out = await _cli(address, "admin", "credential", "revoke", revoked["id"])
    assert out.strip() == f"revoked {revoked['id']} (agent, node n1)"
    assert revoked["id"] not in standby.credentials.revoked, "the standby has not heard of it yet"

    await old.stop()
    del pair[old.controller_id]  # stopped already
    assert await the_leader(pair, never_two=problems) is standby
    assert not problems, problems

    async with grpc.aio.insecure_channel(f"127.0.0.1:{standby.port}") as channel:
        refused = await open_session(channel, register("n1"), token=revoked["token"])
        await expect_status(refused, grpc.StatusCode.PERMISSION_DENIED, f"credential {revoked['id']} was revoked")
        served = await open_session(channel, register("n2"), token=kept["token"])
        first = await asyncio.wait_for(served.read(), 10)
        assert first.WhichOneof("kind") == "registered", "an unrevoked credential still works"
        served.cancel()
