"""Revoking one credential alone: listed by id, refused at once, its open agent session closed (the real agent
process exits 2), recorded in the node's events, and still revoked after a controller restart."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import sqlalchemy as sa

from tests.controller.test_services import expect_status, open_session, register
from tests.support.processes import TOKEN, Daemon, cli_env, run_cli
from topo_tune.controller.credential_ledger import CredentialLedger
from topo_tune.controller.credentials import Credentials, credential_id
from topo_tune.controller.db.models import EventRow
from topo_tune.controller.server import Controller


async def _cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    done = await asyncio.to_thread(run_cli, *args, env=env)
    return done.returncode, done.stdout, done.stderr


async def test_a_revoked_agent_credential_is_refused_and_its_agent_exits(
    controller: Controller, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{controller.port}"
    admin_env = cli_env(TOPO_TUNE_CONTROLLER=address)
    code, out, err = await _cli("admin", "credential", "issue", "--node", "n4", "-o", "json", env=admin_env)
    assert code == 0, err
    issued = json.loads(out)
    assert issued["id"] == credential_id(issued["token"])
    token_file = tmp_path / "n4.token"
    token_file.write_text(issued["token"])
    agent_env = {k: v for k, v in cli_env().items() if k != "TOPO_TUNE_TOKEN"}
    agent = Daemon(
        ["agent", "run", "--controller", address, "--node-name", "n4", "--backend", "sim", "--token-file",
         str(token_file), "--state-dir", str(tmp_path / "state"), "--config-dir", str(tmp_path / "config")],
        tmp_path / "agent.log",
        env=agent_env,
    ).start()  # fmt: skip
    try:
        for _ in range(400):
            if controller.hub.connected("n4"):
                break
            await asyncio.sleep(0.05)
        assert controller.hub.connected("n4"), agent.output()

        code, out, err = await _cli("admin", "credential", "list", "-o", "json", env=admin_env)
        assert code == 0, err
        assert [(c["id"], c["node"], c["revoked"]) for c in json.loads(out)] == [(issued["id"], "n4", "")]
        assert issued["token"] not in out, "a list never shows a token"

        code, out, err = await _cli("admin", "credential", "revoke", issued["id"], env=admin_env)
        assert code == 0, err
        assert out.strip() == f"revoked {issued['id']} (agent, node n4)"

        exit_code = await asyncio.to_thread(agent.process.wait, 30)  # type: ignore[union-attr]
        assert exit_code == 2, agent.output()
        assert f"credential {issued['id']} was revoked" in agent.output()
        assert not controller.hub.connected("n4")

        async with grpc.aio.insecure_channel(address) as channel:
            again = await open_session(channel, register("n4"), token=issued["token"])
            await expect_status(again, grpc.StatusCode.PERMISSION_DENIED, f"credential {issued['id']} was revoked")

        code, out, err = await _cli("admin", "credential", "issue", "--node", "n4", env=admin_env)
        assert code == 1 and "was revoked; a new one needs a new admin token" in err, err
        code, out, err = await _cli("admin", "credential", "list", "-o", "json", env=admin_env)
        assert json.loads(out)[0]["revoked"], "the list says when it was revoked"

        kinds = await controller.db.read(
            lambda s: [(e.node_name, e.kind) for e in s.scalars(sa.select(EventRow).order_by(EventRow.id))]
        )
        assert ("n4", "credential.issued") in kinds and ("n4", "credential.revoked") in kinds

        # A controller started later (a restart, a standby taking over) refuses the same id.
        restarted = Credentials(TOKEN)
        ledger = CredentialLedger(
            db=controller.db,
            credentials=restarted,
            hub=controller.hub,
            wall_clock=controller.services.credential_ledger.wall_clock,
        )
        await ledger.load()
        assert issued["id"] in restarted.revoked
    finally:
        agent.kill()


async def test_an_unknown_or_malformed_id_is_refused_naming_it(controller: Controller) -> None:
    env = cli_env(TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}")
    code, _, err = await _cli("admin", "credential", "revoke", "0123456789ab", env=env)
    assert code == 1 and "no credential 0123456789ab was issued" in err, err
    code, _, err = await _cli("admin", "credential", "revoke", "nope", env=env)
    assert code == 1 and "expected the 12 hex digits" in err, err
