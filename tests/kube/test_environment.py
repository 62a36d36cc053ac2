"""In-cluster detection from a pod's environment and its mounted service account."""

from __future__ import annotations

from pathlib import Path

from topo_tune.kube.environment import KubeEnvironment, detect_in_cluster

POD_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def service_account(tmp_path: Path, *, namespace: str | None = "gpu-ops", ca: bool = True) -> Path:
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("eyJ...", encoding="utf-8")
    if ca:
        (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n", encoding="utf-8")
    if namespace is not None:
        (directory / "namespace").write_text(namespace + "\n", encoding="utf-8")
    return directory


def test_a_pod_with_a_service_account_is_in_cluster(tmp_path: Path) -> None:
    directory = service_account(tmp_path)
    assert detect_in_cluster(POD_ENV, directory) == KubeEnvironment(
        api_url="https://10.96.0.1:443",
        token_file=directory / "token",
        ca_file=directory / "ca.crt",
        namespace="gpu-ops",
    )


def test_an_ipv6_service_host_is_bracketed(tmp_path: Path) -> None:
    environment = detect_in_cluster({**POD_ENV, "KUBERNETES_SERVICE_HOST": "fd00::1"}, service_account(tmp_path))
    assert environment is not None
    assert environment.api_url == "https://[fd00::1]:443"


def test_outside_a_pod_or_without_a_token_it_is_not(tmp_path: Path) -> None:
    directory = service_account(tmp_path)
    assert detect_in_cluster({}, directory) is None, "bare metal: no service variables"
    assert detect_in_cluster({**POD_ENV, "KUBERNETES_SERVICE_PORT": ""}, directory) is None
    (directory / "token").unlink()
    assert detect_in_cluster(POD_ENV, directory) is None, "automountServiceAccountToken: false"
