"""TLS and mutual TLS on the controller's port, with the token still required on top."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.agent.test_daemon import CountingDiscovery, agent_settings
from tests.conftest import controller_settings
from tests.support.certificates import make_pki
from tests.support.processes import TOKEN
from topo_tune.agent.daemon import Agent
from topo_tune.client.admin import AdminClient
from topo_tune.controller.server import Controller
from topo_tune.errors import ControllerUnavailable, Unauthenticated
from topo_tune.security.auth import TlsFiles


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
async def test_agents_and_admins_over_tls(tmp_path: Path, sqlite_url: str, mutual: bool) -> None:
    pki = make_pki(tmp_path)
    server_tls = TlsFiles(cert=pki.server_cert, key=pki.server_key, ca=pki.ca if mutual else None)
    controller = Controller(controller_settings(sqlite_url, tls=server_tls))
    await controller.start()
    address = f"localhost:{controller.port}"
    client_tls = TlsFiles(ca=pki.ca, cert=pki.client_cert if mutual else None, key=pki.client_key if mutual else None)
    try:
        settings = agent_settings(address, tmp_path / "agent")
        agent = Agent(
            type(settings)(**{**settings.__dict__, "tls": client_tls}),
            discover=CountingDiscovery(),
            rng=random.Random(0),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await asyncio.wait_for(agent.registered.wait(), 20)

        def admin_calls() -> None:
            with AdminClient(address, token=TOKEN, tls=client_tls) as client:
                assert [n.name for n in client.list_nodes()] == ["n1"]
            with AdminClient(address, token="wrong", tls=client_tls) as client, pytest.raises(Unauthenticated):
                client.list_nodes()
            with (
                AdminClient(address, token=TOKEN, tls=None, timeout_s=3) as plaintext,
                pytest.raises(ControllerUnavailable),
            ):
                plaintext.list_nodes()
            if mutual:
                without_cert = TlsFiles(ca=pki.ca)
                with (
                    AdminClient(address, token=TOKEN, tls=without_cert, timeout_s=3) as client,
                    pytest.raises(ControllerUnavailable),
                ):
                    client.list_nodes()

        await asyncio.to_thread(admin_calls)
        stop.set()
        await asyncio.wait_for(task, 20)
    finally:
        await controller.stop()
