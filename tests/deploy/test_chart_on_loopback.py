"""`helm install` + `helm test`, replayed on loopback with the chart's own objects.

The rendered controller Deployment, agent DaemonSet and helm-test Pod are run as real `topo-tune` processes:
their args and env as rendered, their ConfigMap/Secret volumes written to temporary directories at the
mounted paths' stand-ins, Service addresses and container ports mapped to free loopback ports. Kubelet's
gRPC readiness probe is replayed against the probe port, and the helm test must see the agent `ready`.
What this cannot show (scheduling, RBAC enforcement, the NVIDIA runtime) is covered by the render tests.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import re
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.deploy.chart_render import NAMESPACE, RELEASE, Manifest, Rendered, containers, pod_spec, render
from tests.support.processes import Daemon, free_port, run_cli
from tests.support.waiting import wait_until

NODE = "gpu-node-1"
SERVICE_HOST = f"{RELEASE}-topo-tune-controller.{NAMESPACE}.svc"


@dataclass
class Loopback:
    """Runs rendered pods as local processes; one port map stands in for pod IPs and the Service."""

    rendered: Rendered
    root: Path
    secrets: dict[str, dict[str, bytes]] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for secret in self.rendered.all("Secret"):
            data = {key: base64.b64decode(value) for key, value in secret["data"].items()}
            self.secrets[secret["metadata"]["name"]] = data

    def port(self, container_port: int) -> int:
        return self.ports.setdefault(container_port, free_port())

    def command(self, workload: Manifest) -> tuple[list[str], dict[str, str]]:
        (container,) = containers(workload)
        volumes = {volume["name"]: volume for volume in pod_spec(workload).get("volumes", [])}
        local_dirs: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            local = self.root / workload["metadata"]["name"] / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            self._fill(local, volumes[mount["name"]])
            local_dirs[mount["mountPath"]] = local
        args = [self._localize(arg, local_dirs) for arg in container["args"]]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_TUNE_")}
        env["PYTHONUNBUFFERED"] = "1"
        for entry in container.get("env", []):
            env[entry["name"]] = self._env_value(entry)
        return args, env

    def _fill(self, local: Path, volume: Manifest) -> None:
        if "configMap" in volume:
            (configmap,) = [
                c for c in self.rendered.all("ConfigMap") if c["metadata"]["name"] == volume["configMap"]["name"]
            ]
            for key, text in configmap["data"].items():
                (local / key).write_text(text)
        elif "secret" in volume:
            data = self.secrets[volume["secret"]["secretName"]]
            items = volume["secret"].get("items") or [{"key": key, "path": key} for key in data]
            for item in items:
                (local / item["path"]).write_bytes(data[item["key"]])

    def _localize(self, arg: str, local_dirs: dict[str, Path]) -> str:
        if local_dirs:  # one pass: a substituted directory must not be substituted again
            mounts = "|".join(re.escape(path) for path in sorted(local_dirs, key=len, reverse=True))
            arg = re.sub(rf"({mounts})(?=/|$)", lambda m: str(local_dirs[m.group(1)]), arg)
        arg = re.sub(r"^0\.0\.0\.0:(\d+)$", lambda m: f"127.0.0.1:{self.port(int(m.group(1)))}", arg)
        return re.sub(rf"^{re.escape(SERVICE_HOST)}:(\d+)$", lambda m: f"127.0.0.1:{self.port(int(m.group(1)))}", arg)

    def _env_value(self, entry: Manifest) -> str:
        if "value" in entry:
            return str(entry["value"])
        source = entry["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "spec.nodeName"
            return NODE
        ref = source["secretKeyRef"]
        return self.secrets[ref["name"]][ref["key"]].decode()

    def start(self, workload: Manifest) -> Daemon:
        args, env = self.command(workload)
        return Daemon(args, self.root / f"{workload['metadata']['name']}.log", env=env).start()


def _probe(port: int) -> bool:
    """Kubelet's gRPC probe: grpc.health.v1 Check for the server ("") over plaintext."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _certificates() -> dict[str, dict[str, bytes]]:
    """A CA, a server certificate naming the Service (and 127.0.0.1) and a client certificate."""
    now = datetime.datetime.now(datetime.UTC)

    def issue(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None
    ) -> x509.CertificateBuilder:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer[0] if issuer else name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        issue("topo-tune test CA", ca_key, None)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca = (ca_cert.subject, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        issue(SERVICE_HOST, server_key, ca)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(SERVICE_HOST), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = (
        issue("topo-tune agent", client_key, ca)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    return {
        "controller-tls": {
            "tls.crt": server_cert.public_bytes(serialization.Encoding.PEM),
            "tls.key": pem_key(server_key),
            "ca.crt": ca_pem,
        },
        "agent-tls": {
            "tls.crt": client_cert.public_bytes(serialization.Encoding.PEM),
            "tls.key": pem_key(client_key),
            "ca.crt": ca_pem,
        },
    }


BASE_VALUES: dict[str, Any] = {"agent": {"backend": "sim", "rack": "rack-1"}}
MTLS_VALUES: dict[str, Any] = {
    **BASE_VALUES,
    "tls": {"enabled": True, "existingSecret": "controller-tls", "agentExistingSecret": "agent-tls"},
}


def _wait(check: Callable[[], bool], *, what: str, daemons: list[Daemon]) -> None:
    try:
        wait_until(check, what=what)
    except AssertionError as error:
        logs = "\n".join(f"--- {' '.join(d.args[:2])}:\n{d.output()}" for d in daemons)
        raise AssertionError(f"{error}\n{logs}") from None


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.kill()


@pytest.mark.parametrize("values", [BASE_VALUES, MTLS_VALUES], ids=["token", "mtls"])
def test_install_then_helm_test_on_loopback(values: dict[str, Any], tmp_path: Path, daemons: list[Daemon]) -> None:
    rendered = render(values)
    loopback = Loopback(rendered, tmp_path)
    if values.get("tls"):
        loopback.secrets.update(_certificates())

    controller = loopback.start(rendered.controller)
    daemons.append(controller)
    (controller_container,) = containers(rendered.controller)
    probe_port = loopback.port(controller_container["readinessProbe"]["grpc"]["port"])
    _wait(lambda: _probe(probe_port), what="the readiness probe to pass", daemons=daemons)
    daemons.append(loopback.start(rendered.agent))

    test_args, test_env = loopback.command(rendered.test_pod)

    def agent_ready() -> bool:
        result = run_cli(*test_args, env=test_env)
        nodes = json.loads(result.stdout) if result.returncode == 0 else []
        return any(node.get("name") == NODE and node.get("state") == "NODE_STATE_READY" for node in nodes)

    _wait(agent_ready, what=f"helm test to list {NODE} ready", daemons=daemons)
    (node,) = json.loads(run_cli(*test_args, env=test_env).stdout)
    assert node["rack"] == "rack-1"

    # The ServiceMonitor's target: the Service's metrics port.
    metrics_port = loopback.port(values.get("controller", {}).get("ports", {}).get("metrics", 9464))
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        assert response.status == 200

    if values.get("tls"):
        # The gRPC port really requires TLS: the same call without the client TLS flags fails.
        plain = [arg for arg in test_args if not arg.startswith("--tls") and not arg.endswith((".crt", ".key"))]
        assert run_cli(*plain, env=test_env, timeout=30).returncode != 0
