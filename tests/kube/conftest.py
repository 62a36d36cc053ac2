"""Fixtures: a fake Kubernetes API server on loopback and environments (one token each) pointing at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kube.fake_apiserver import FakeApiServer
from topo_tune.kube.environment import KubeEnvironment


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


KubeEnvFactory = Callable[[str], KubeEnvironment]


@pytest.fixture
def kube_env(apiserver: FakeApiServer, tmp_path: Path) -> KubeEnvFactory:
    """``kube_env("token-a")``: an environment whose requests carry that (accepted) token."""

    def make(token: str) -> KubeEnvironment:
        apiserver.tokens.add(token)
        token_file = tmp_path / f"{token}.token"
        token_file.write_text(token + "\n", encoding="utf-8")
        return KubeEnvironment(api_url=apiserver.url, token_file=token_file, namespace="topo-tune", request_timeout_s=2)

    return make
