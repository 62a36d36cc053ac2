"""Errors that heal and errors that do not: a real agent process against a real controller exits with status 2
and one line naming what to fix when only the operator can fix it; the address without a port is the project's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from tests.support.processes import TOKEN, cli_env, run_cli
from topo_tune.agent.backoff import heals
from topo_tune.client.admin import AdminClient
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.server import Controller
from topo_tune.security.auth import DEFAULT_PORT, with_default_port

CREDENTIALS = Credentials(TOKEN)


def test_only_answers_that_waiting_can_change_are_retried() -> None:
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
        assert heals(code, registered=False) and heals(code, registered=True), code
    for code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        assert not heals(code, registered=False) and not heals(code, registered=True), code
    assert not heals(grpc.StatusCode.INVALID_ARGUMENT, registered=False), "a registration refused as invalid"
    assert heals(grpc.StatusCode.INVALID_ARGUMENT, registered=True), "one bad message of a working session"


@pytest.mark.parametrize(
    ("given", "dialled"),
    [
        ("localhost", f"localhost:{DEFAULT_PORT}"),
        ("localhost:", f"localhost:{DEFAULT_PORT}"),
        ("10.0.0.5:6000", "10.0.0.5:6000"),
        ("::1", f"[::1]:{DEFAULT_PORT}"),
        ("[::1]", f"[::1]:{DEFAULT_PORT}"),
        ("[::1]:7000", "[::1]:7000"),
        ("dns:///controller.example:7000", "dns:///controller.example:7000"),
        ("unix:/run/topo-tune.sock", "unix:/run/topo-tune.sock"),
    ],
)
def test_an_address_without_a_port_dials_the_controllers_default_port(given: str, dialled: str) -> None:
    assert with_default_port(given) == dialled


async def _agent(tmp_path: Path, *args: str, token: str | None) -> tuple[int, str]:
    env = {k: v for k, v in cli_env().items() if k != "TOPO_TUNE_TOKEN"}
    if token is not None:
        env["TOPO_TUNE_TOKEN"] = token
    common = ["--backend", "sim", "--state-dir", str(tmp_path / "state"), "--config-dir", str(tmp_path / "config")]
    done = await asyncio.to_thread(run_cli, "agent", "run", *common, *args, env=env, timeout=60)
    return done.returncode, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


async def test_a_token_of_another_cluster_ends_the_agent_naming_its_token_file(
    controller: Controller, tmp_path: Path
) -> None:
    token_file = tmp_path / "gpu-a1.token"
    token_file.write_text(Credentials("another cluster's token").issue_agent("gpu-a1"))
    address = f"127.0.0.1:{controller.port}"
    code, line = await _agent(
        tmp_path,
        "--controller",
        address,
        "--node-name",
        "gpu-a1",
        "--token-file",
        str(token_file),
        "--token-grace",
        "0.5",
        token=None,
    )
    assert code == 2, line
    assert line == (
        f"topo-tune: error: --token-file {token_file} is not this cluster's credential for node gpu-a1 "
        f"(refused by {address})"
    )


async def test_another_nodes_credential_ends_the_agent_naming_both_nodes(
    controller: Controller, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{controller.port}"
    code, line = await _agent(
        tmp_path, "--controller", address, "--node-name", "gpu-b1", token=CREDENTIALS.issue_agent("gpu-a1")
    )
    assert code == 2, line
    assert line.startswith("topo-tune: error: the token in $TOPO_TUNE_TOKEN is not a credential node gpu-b1")
    assert "this credential is for node 'gpu-a1'; it cannot register as 'gpu-b1'" in line
    assert "''" not in line, "no doubled quote"
    assert "gpu-b1" not in {n.name for n in await controller.registry.list()}, "nothing registered"


async def test_an_invalid_node_name_ends_the_agent_naming_the_flag(controller: Controller, tmp_path: Path) -> None:
    code, line = await _agent(
        tmp_path, "--controller", f"127.0.0.1:{controller.port}", "--node-name", "bad name!", token=TOKEN
    )
    assert code == 2, line
    assert "refused to register node bad name!" in line and "--node-name" in line


def test_every_command_that_takes_controller_dials_the_default_port_of_a_bare_host() -> None:
    # The agent dials through open_channel, every admin/env/exec command through AdminClient: both default it.
    with AdminClient("localhost", token="t") as client:
        assert client.address == f"localhost:{DEFAULT_PORT}"
