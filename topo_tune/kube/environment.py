"""Where the Kubernetes API is: detected from a pod's service account, or named explicitly.

In a pod, kubelet sets ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` and mounts the service
account's token, CA bundle and namespace under ``/var/run/secrets/kubernetes.io/serviceaccount``. Both the
environment and the directory are parameters, so detection is testable without a cluster.

Non-goal: kubeconfig files. The daemons run in pods; tests name their API server with ``KubeEnvironment``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class KubeEnvironment:
    """How to reach the Kubernetes API, and as whom."""

    api_url: str
    """``https://HOST:PORT`` of the API server."""
    token_file: Path | None = None
    """Bearer token, re-read on every request: projected service-account tokens rotate."""
    ca_file: Path | None = None
    """CA bundle that signed the API server's certificate."""
    namespace: str = ""
    """The pod's own namespace (from the service account), default for the controller's Lease."""
    request_timeout_s: float = 5.0
    """Per request; leader election also bounds each round by its renew deadline."""


def _join_host_port(host: str, port: str) -> str:
    # An IPv6 service host needs brackets in a URL, as Go's net.JoinHostPort does it.
    return f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"


def detect_in_cluster(
    environ: Mapping[str, str], service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> KubeEnvironment | None:
    """The API of the cluster this process runs in, or None when it does not run in a pod.

    A pod without a mounted service-account token (``automountServiceAccountToken: false``) counts as not
    in-cluster: it could not authenticate anyway.
    """
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    token = service_account_dir / "token"
    if not host or not port:
        return None
    if not token.is_file():
        logger.info("KUBERNETES_SERVICE_HOST is set but no service-account token is mounted: not using the API")
        return None
    ca = service_account_dir / "ca.crt"
    namespace_file = service_account_dir / "namespace"
    namespace = namespace_file.read_text(encoding="utf-8").strip() if namespace_file.is_file() else ""
    return KubeEnvironment(
        api_url=f"https://{_join_host_port(host, port)}",
        token_file=token,
        ca_file=ca if ca.is_file() else None,
        namespace=namespace,
    )
