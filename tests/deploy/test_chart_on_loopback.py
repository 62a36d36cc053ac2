"""`helm install` + `helm test`, replayed on loopback with the chart's own objects.

The rendered controller Deployment, agent DaemonSet and helm-test Pod are run as real `topo-tune` processes:
their args and env as rendered, their ConfigMap/Secret volumes written to temporary directories at the
mounted paths' stand-ins, Service addresses and container ports mapped to free loopback ports. Kubelet's
gRPC liveness and readiness probes are replayed against the probe port, and the helm test must see the agent
`ready`. With two replicas the rendered controller is parsed by the real CLI and run in-process against a fake
Kubernetes API server (a pod's service account cannot be faked for a subprocess): both replicas are Ready, the
Service's selector matches the leader's pod alone (its label), the standby takes over and the Service follows
when the leader stops, and every Lease and pod request they make is one the chart's Role allows. What this
cannot show (scheduling, the NVIDIA runtime) is covered by the render tests.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import functools
import ipaddress
import json
import os
import re
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import grpc.aio
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.deploy.chart_render import (
    NAMESPACE,
    RELEASE,
    Manifest,
    Rendered,
    ci_values,
    containers,
    pod_spec,
    render,
)
from tests.kube.fake_apiserver import LEASE_PATH, POD_PATH, FakeApiServer
from tests.support.processes import Daemon, free_port, run_cli
from tests.support.waiting import async_wait_until, wait_until
from topo_tune.cli import controller as controller_cli
from topo_tune.cli.main import cli
from topo_tune.controller.server import Controller
from topo_tune.controller.settings import ControllerSettings
from topo_tune.kube.environment import KubeEnvironment

pytestmark = pytest.mark.slow  # the chart's controller, agents and helm-test Pod as real processes

NODE = "gpu-node-1"
CONTROLLER = f"{RELEASE}-topo-tune-controller"
SERVICE_HOST = f"{CONTROLLER}.{NAMESPACE}.svc"


@dataclass
class Loopback:
    """Runs rendered pods as local processes; one port map stands in for pod IPs and the Service."""

    rendered: Rendered
    root: Path
    secrets: dict[str, dict[str, bytes]] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)
    pod_name: str = f"{CONTROLLER}-0"

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
            fields = {"spec.nodeName": NODE, "metadata.namespace": NAMESPACE, "metadata.name": self.pod_name}
            return fields[source["fieldRef"]["fieldPath"]]
        ref = source["secretKeyRef"]
        return self.secrets[ref["name"]][ref["key"]].decode()

    def start(self, workload: Manifest) -> Daemon:
        args, env = self.command(workload)
        return Daemon(args, self.root / f"{workload['metadata']['name']}.log", env=env).start()


def _probe(loopback: Loopback, probe: Manifest) -> bool:
    """Kubelet's gRPC probe: grpc.health.v1 Check for the probe's service ("" when unset) over plaintext."""
    request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
    with grpc.insecure_channel(f"127.0.0.1:{loopback.port(probe['grpc']['port'])}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=2)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def _probe_async(loopback: Loopback, probe: Manifest) -> bool:
    """``_probe`` for a controller that runs on this event loop; as kubelet, no answer is a failed probe."""
    request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{loopback.port(probe['grpc']['port'])}") as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=2)
        except grpc.aio.AioRpcError:
            return False
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
    for probe in ("livenessProbe", "readinessProbe"):
        check = functools.partial(_probe, loopback, controller_container[probe])
        _wait(check, what=f"the {probe} to pass", daemons=daemons)
    daemons.append(loopback.start(rendered.agent))

    test_args, test_env = loopback.command(rendered.test_pod)

    def agent_ready() -> bool:
        result = run_cli(*test_args, env=test_env)
        nodes = json.loads(result.stdout) if result.returncode == 0 else []
        return any(node.get("name") == NODE and node.get("state") == "ready" for node in nodes)

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


HA_VALUES: dict[str, Any] = {**BASE_VALUES, **ci_values()["external-postgres"]}  # two replicas
LEASE_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class Replica:
    """One controller pod of the Deployment: its settings as the real CLI parsed them, and its port map."""

    settings: ControllerSettings
    loopback: Loopback


def _replica(rendered: Rendered, root: Path, *, kube: KubeEnvironment, database_url: str, pod_name: str) -> Replica:
    """Parse the rendered controller's args and env with `topo-tune controller serve` (which then runs nothing).

    The pod's in-cluster API (service account, KUBERNETES_SERVICE_*) is the fake API server.
    """
    loopback = Loopback(rendered, root, pod_name=pod_name)
    loopback.secrets["topo-tune-db"] = {"url": database_url.encode()}
    args, env = loopback.command(rendered.controller)
    parsed: list[ControllerSettings] = []

    async def serve(settings: ControllerSettings) -> None:
        parsed.append(settings)

    hidden: dict[str, str | None] = {key: None for key in os.environ if key.startswith("TOPO_TUNE_")}
    container_env = {key: value for key, value in env.items() if key.startswith("TOPO_TUNE_")}
    with (
        mock.patch.object(controller_cli, "_serve", serve),
        mock.patch.object(controller_cli, "detect_in_cluster", lambda environ: kube),
    ):
        result = CliRunner().invoke(cli, args, env={**hidden, **container_env})
    assert result.exit_code == 0, result.output
    (settings,) = parsed
    return Replica(settings, loopback)


def _request_allowed(rendered: Rendered, method: str, path: str) -> bool:
    """Whether the release's RBAC lets the controller's ServiceAccount make this Lease or pod request."""
    url = urllib.parse.urlsplit(path).path
    if match := LEASE_PATH.match(url):
        group, resource = "coordination.k8s.io", "leases"
    elif match := POD_PATH.match(url):
        group, resource = "", "pods"
    else:
        raise AssertionError(f"the controller called {method} {path}, which the chart's Role is not about")
    namespace, name = match.groups()
    verb = LEASE_VERBS[method] if name or method != "GET" else "list"
    bound = {
        binding["roleRef"]["name"]
        for binding in rendered.all("RoleBinding")
        if {"kind": "ServiceAccount", "name": CONTROLLER, "namespace": NAMESPACE} in binding["subjects"]
    }
    return any(
        role["metadata"]["namespace"] == namespace
        and group in rule["apiGroups"]
        and resource in rule["resources"]
        and verb in rule["verbs"]
        # A rule with resourceNames never authorizes a request without a name (create, list).
        and ("resourceNames" not in rule or name in rule["resourceNames"])
        for role in rendered.all("Role")
        if role["metadata"]["name"] in bound
        for rule in role["rules"]
    )


def test_replicas_elect_one_ready_leader_and_fail_over(tmp_path: Path) -> None:
    """The rendered two-replica Deployment, parsed by the real CLI, against a fake Kubernetes API server."""
    rendered = render(HA_VALUES)
    (container,) = containers(rendered.controller)
    apiserver = FakeApiServer().start()
    try:
        replicas = []
        for index in range(2):
            token = f"controller-{index}"
            apiserver.tokens.add(token)
            (tmp_path / token).mkdir()
            (tmp_path / token / "sa-token").write_text(token)
            kube = KubeEnvironment(api_url=apiserver.url, token_file=tmp_path / token / "sa-token", namespace="default")
            pod_name = f"{CONTROLLER}-{index}"
            template = rendered.controller["spec"]["template"]["metadata"]["labels"]
            apiserver.add_pod(NAMESPACE, pod_name, node=NODE, labels=dict(template))
            database_url = f"sqlite:///{tmp_path / 'shared.db'}"
            root = tmp_path / token
            replicas.append(_replica(rendered, root, kube=kube, database_url=database_url, pod_name=pod_name))
        service = rendered.one("Service", CONTROLLER)
        asyncio.run(_elect_and_fail_over(replicas, container, apiserver, service["spec"]["selector"]))
        lease = apiserver.lease(NAMESPACE, CONTROLLER)
        requests = list(apiserver.requests)
    finally:
        apiserver.stop()
    # The Lease of this release, in the pod's namespace (not the service account's "default").
    assert lease is not None and lease["spec"]["leaseTransitions"] >= 1
    assert {method for method, _, _ in requests} >= {"GET", "POST", "PUT"}
    assert ("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{CONTROLLER}-0") in {(m, p) for m, p, _ in requests}
    refused = sorted({(m, p) for m, p, _ in requests if not _request_allowed(rendered, m, p)})
    assert refused == [], "the chart's Role would refuse these requests"


async def _elect_and_fail_over(
    replicas: list[Replica], container: Manifest, apiserver: FakeApiServer, selector: dict[str, str]
) -> None:
    async def states() -> list[tuple[bool, bool]]:
        """(live, ready) of each replica, as kubelet's probes would see them."""
        return [
            (
                await _probe_async(replica.loopback, container["livenessProbe"]),
                await _probe_async(replica.loopback, container["readinessProbe"]),
            )
            for replica in replicas
        ]

    def selected(index: int) -> bool:
        pod = apiserver.pod(NAMESPACE, replicas[index].loopback.pod_name)
        assert pod is not None
        return all(pod["metadata"]["labels"].get(key) == value for key, value in selector.items())

    async def endpoints() -> list[int]:
        """The replicas behind the Service: Ready, and matching its selector."""
        return [i for i, (_, ready) in enumerate(await states()) if ready and selected(i)]

    async def one_endpoint() -> list[int] | None:
        found = await endpoints()
        return found if len(found) == 1 else None

    controllers = [Controller(replica.settings) for replica in replicas]
    running = list(controllers)
    try:
        for controller in controllers:
            await controller.start()
        (index,) = await async_wait_until(one_endpoint, timeout=15, what="the Service to select one controller")
        leader = controllers[index]
        assert leader.leading and sum(c.leading for c in controllers) == 1
        assert all(live and ready for live, ready in await states()), "every replica is alive and Ready"

        # The leader stops (SIGTERM: drain, rolling update, eviction): it releases the Lease, the standby
        # takes over and the Service follows the label.
        await leader.stop()
        running.remove(leader)
        (standby,) = running
        new_index = controllers.index(standby)
        assert not selected(index), "the stopped leader took its label off"
        await async_wait_until(
            lambda: _is(endpoints(), [new_index]), timeout=15, what="the Service to select the new leader"
        )
        assert standby.leading
    finally:
        for controller in running:
            await controller.stop()


async def _is(found: Awaitable[list[int]], expected: list[int]) -> bool:
    return await found == expected
