"""The Helm chart, rendered offline by Helm's engine: what a cluster would receive for each option set.

Like k8s-device-plugin's terratest suite, these render the chart and assert on the objects: selectors,
scheduling onto GPU nodes, security contexts, mounts, flags and environment.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import helm_python
import pytest
import yaml

from tests.deploy.chart_render import (
    NAMESPACE,
    RELEASE,
    Rendered,
    ci_values,
    containers,
    env_of,
    flag_values,
    mounts_of,
    pod_spec,
    render,
    volumes_of,
)
from topo_tune.kube.serving_label import LEADER_LABEL

CONTROLLER = f"{RELEASE}-topo-tune-controller"
AGENT = f"{RELEASE}-topo-tune-agent"
CONTROLLER_ADDRESS = f"{CONTROLLER}.{NAMESPACE}.svc:50051"
# The health service that only the leading controller serves (topo_tune.controller.server.SERVICE_NAMES).
READINESS_SERVICE = "topo_tune.v1.AgentService"


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render()


@pytest.fixture(scope="module")
def option_sets() -> dict[str, Rendered]:
    return {name: render(values) for name, values in ci_values().items()}


def test_default_render_has_the_whole_install(default: Rendered) -> None:
    assert default.kinds() == sorted(
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "Deployment",
            "NetworkPolicy",
            "NetworkPolicy",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "Pod",
            "Secret",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
        ]
    )
    namespaced = [o for o in default.objects if not o["kind"].startswith("Cluster")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {NAMESPACE}


def test_selectors_match_their_pods_and_keep_components_apart(default: Rendered) -> None:
    controller_selector = default.controller["spec"]["selector"]["matchLabels"]
    agent_selector = default.agent["spec"]["selector"]["matchLabels"]
    for workload, selector in ((default.controller, controller_selector), (default.agent, agent_selector)):
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        # Selectors are immutable: a label that changes with every upgrade would break `helm upgrade`.
        assert "helm.sh/chart" not in selector and "app.kubernetes.io/version" not in selector
    assert controller_selector["app.kubernetes.io/component"] == "controller"
    assert agent_selector["app.kubernetes.io/component"] == "agent"

    service = default.one("Service", CONTROLLER)
    assert service["spec"]["selector"] == controller_selector
    pdb = default.one("PodDisruptionBudget", CONTROLLER)
    assert pdb["spec"]["selector"]["matchLabels"] == controller_selector
    assert pdb["spec"]["maxUnavailable"] == 1  # a single replica must never block `kubectl drain`
    test_labels = default.test_pod["metadata"]["labels"]
    assert not controller_selector.items() <= test_labels.items(), "the Service must not route to the test pod"


def test_agent_runs_only_on_gpu_nodes_and_survives_gpu_taints(default: Rendered) -> None:
    spec = pod_spec(default.agent)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # nodeSelectorTerms are ORed: a node labelled by GPU feature discovery OR by node-feature-discovery.
    assert [term["matchExpressions"] for term in terms] == [
        [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}],
        [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}],
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert default.agent["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }


def test_agent_sees_gpus_without_requesting_them(default: Rendered) -> None:
    spec = pod_spec(default.agent)
    (agent,) = containers(default.agent)
    assert spec["runtimeClassName"] == "nvidia"
    env = env_of(agent)
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    for section in ("requests", "limits"):
        assert "nvidia.com/gpu" not in agent["resources"].get(section, {}), "the agent must not hold GPUs"
    # NCCL's intra-node transport needs a real /dev/shm, not the runtime's 64 MiB default.
    assert volumes_of(default.agent)["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert mounts_of(agent)["/dev/shm"]["name"] == "dshm"


def test_agent_flags_env_and_host_directories(default: Rendered) -> None:
    (agent,) = containers(default.agent)
    assert agent["image"] == "topo-tune/agent:0.1.0"
    assert agent["args"][:2] == ["agent", "run"]
    flags = flag_values(agent["args"])
    assert flags == {
        "--controller": CONTROLLER_ADDRESS,
        "--backend": "nccl",
        "--state-dir": "/var/lib/topo-tune",
        "--config-dir": "/etc/nccl/topo-tune",
        "--token-file": "/etc/topo-tune/auth/token",
    }
    env = env_of(agent)
    assert env["TOPO_TUNE_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["TOPO_TUNE_RACK_LABEL"]["value"] == "topology.kubernetes.io/rack"
    assert "TOPO_TUNE_RACK" not in env
    assert "TOPO_TUNE_TOKEN" not in env, "the token travels as a file, never into benchmark workers' environment"

    volumes = volumes_of(default.agent)
    mounts = mounts_of(agent)
    for host_dir, volume in (("/etc/nccl/topo-tune", "config-dir"), ("/var/lib/topo-tune", "state-dir")):
        assert volumes[volume]["hostPath"] == {"path": host_dir, "type": "DirectoryOrCreate"}
        # Same path inside and outside: paths the agent writes into configs are valid in training pods.
        assert mounts[host_dir] == {"name": volume, "mountPath": host_dir}
    assert mounts["/etc/topo-tune/auth"]["readOnly"] is True
    assert volumes["token"]["secret"]["secretName"] == f"{RELEASE}-topo-tune-token"


def test_agent_is_root_without_capabilities(default: Rendered) -> None:
    (agent,) = containers(default.agent)
    context = agent["securityContext"]
    assert context["runAsUser"] == 0  # root-owned host directories; see the chart README
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert pod_spec(default.agent)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod_spec(default.agent)
    # With a read-only root filesystem every writable place must be a volume.
    assert {"/tmp", "/dev/shm", "/var/lib/topo-tune", "/etc/nccl/topo-tune"} <= mounts_of(agent).keys()


def test_controller_is_non_root_with_sqlite_on_a_volume(default: Rendered) -> None:
    spec = pod_spec(default.controller)
    (controller,) = containers(default.controller)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    assert spec["securityContext"]["fsGroup"] == 10001  # makes the database volume writable for that user
    assert controller["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert controller["args"][:2] == ["controller", "serve"]
    assert flag_values(controller["args"]) == {
        "--config": "/etc/topo-tune/config/cluster.yaml",
        "--listen": "0.0.0.0:50051",
        "--metrics-listen": "0.0.0.0:9464",
        "--token-file": "/etc/topo-tune/auth/token",
        "--database": "sqlite:////var/lib/topo-tune/controller.db",
    }
    assert {entry["name"] for entry in controller["env"]} == {"TOPO_TUNE_LOG_LEVEL", "TOPO_TUNE_LOG_FORMAT"}
    volumes = volumes_of(default.controller)
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == f"{CONTROLLER}-db"
    assert mounts_of(controller)["/var/lib/topo-tune"]["name"] == "data"
    assert volumes["cluster-config"]["configMap"]["name"] == CONTROLLER
    assert mounts_of(controller)["/etc/topo-tune/config"]["readOnly"] is True
    # One writer on a ReadWriteOnce volume: the old pod goes before the new one starts.
    assert default.controller["spec"]["strategy"] == {"type": "Recreate"}

    pvc = default.one("PersistentVolumeClaim", f"{CONTROLLER}-db")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_controller_probes_and_ports_without_tls(default: Rendered) -> None:
    (controller,) = containers(default.controller)
    assert {p["name"]: p["containerPort"] for p in controller["ports"]} == {"grpc": 50051, "metrics": 9464}
    assert controller["livenessProbe"]["grpc"] == {"port": 50051}
    assert controller["readinessProbe"]["grpc"] == {"port": 50051, "service": READINESS_SERVICE}
    service = default.one("Service", CONTROLLER)
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "grpc": (50051, "grpc"),
        "metrics": (9464, "metrics"),
    }


def test_cluster_config_reaches_the_controller(default: Rendered) -> None:
    configmap = default.one("ConfigMap", CONTROLLER)
    # The chart owns the keys controller and agents must agree on (the loader test is in the CLI contract).
    assert yaml.safe_load(configmap["data"]["cluster.yaml"]) == {
        "apiVersion": "topo-tune/v1",
        "backend": "nccl",
        "rackLabel": "topology.kubernetes.io/rack",
        "metadata": {"name": RELEASE},
    }
    annotations = default.controller["spec"]["template"]["metadata"]["annotations"]
    changed = render({"clusterConfig": {"apiVersion": "topo-tune/v1", "racks": [{"name": "r1"}]}})
    assert "racks:" in changed.one("ConfigMap", CONTROLLER)["data"]["cluster.yaml"]
    changed_annotations = changed.controller["spec"]["template"]["metadata"]["annotations"]
    # A new cluster.yaml must roll the controller, which reads it at start-up.
    assert changed_annotations["checksum/cluster-config"] != annotations["checksum/cluster-config"]


def test_token_secret_is_generated_or_taken_from_values(default: Rendered) -> None:
    secret = default.one("Secret", f"{RELEASE}-topo-tune-token")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    given = render({"auth": {"token": "s3cret-token"}}).one("Secret", f"{RELEASE}-topo-tune-token")
    assert base64.b64decode(given["data"]["token"]).decode() == "s3cret-token"

    existing = render({"auth": {"existingSecret": "my-token", "secretKey": "bearer"}})
    assert existing.all("Secret") == []
    (agent,) = containers(existing.agent)
    assert volumes_of(existing.agent)["token"]["secret"]["secretName"] == "my-token"
    assert flag_values(agent["args"])["--token-file"] == "/etc/topo-tune/auth/bearer"
    test_env = env_of(containers(existing.test_pod)[0])
    assert test_env["TOPO_TUNE_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "my-token", "key": "bearer"}


def test_agents_can_hold_their_own_node_credentials_instead_of_the_admin_token() -> None:
    rendered = render({"auth": {"agentCredentials": {"existingSecret": "node-credentials"}}})
    (agent,) = containers(rendered.agent)
    assert flag_values(agent["args"])["--token-file"] == "/etc/topo-tune/agent-credentials/$(TOPO_TUNE_NODE_NAME)"
    assert env_of(agent)["TOPO_TUNE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    volumes = volumes_of(rendered.agent)
    assert volumes["agent-credentials"]["secret"]["secretName"] == "node-credentials"
    assert "token" not in volumes, "no agent pod mounts the admin token"
    (controller, *_) = containers(rendered.controller)
    assert flag_values(controller["args"])["--token-file"] == "/etc/topo-tune/auth/token"


def test_agents_can_authenticate_with_their_pods_service_account_token(default: Rendered) -> None:
    rendered = render({"auth": {"agentCredentials": {"serviceAccountTokens": True}}})
    (agent,) = containers(rendered.agent)
    assert flag_values(agent["args"])["--token-file"] == "/var/run/secrets/topo-tune/token"
    volumes = volumes_of(rendered.agent)
    (source,) = volumes["agent-identity"]["projected"]["sources"]
    assert source["serviceAccountToken"] == {"audience": "topo-tune", "expirationSeconds": 3600, "path": "token"}
    assert "token" not in volumes, "no agent pod mounts the admin token"
    (controller, *_) = containers(rendered.controller)
    agent_account = rendered.agent["spec"]["template"]["spec"]["serviceAccountName"]
    assert flag_values(controller["args"])["--agent-service-account"] == f"{NAMESPACE}:{agent_account}"
    review = {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    assert review in rendered.one("ClusterRole", rendered.controller["metadata"]["name"])["rules"]
    assert all(review not in role["rules"] for role in default.all("ClusterRole"))


def test_rbac_is_read_only_by_default(default: Rendered) -> None:
    for role in default.all("ClusterRole") + default.all("Role"):
        for rule in role["rules"]:
            if rule["apiGroups"] == [""]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, role["metadata"]["name"]
    agent_role = default.one("ClusterRole", AGENT)
    assert agent_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    binding = default.one("ClusterRoleBinding", AGENT)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}]
    assert pod_spec(default.agent)["serviceAccountName"] == AGENT
    assert pod_spec(default.controller)["serviceAccountName"] == CONTROLLER
    # One replica leads alone: no Lease, no permission on Leases.
    assert default.all("Role") == [] and default.all("RoleBinding") == []
    assert default.find("ClusterRole", f"{CONTROLLER}-cordon") is None


def test_the_controller_may_read_a_training_jobs_pods_job_and_jobset_and_nothing_more(default: Rendered) -> None:
    # `env`/`exec` with only a Job's or JobSet's uid: the controller lists its pods (kube/job_nodes.py) and reads
    # the Job or JobSet for how many run together; it neither writes them nor reads anything else of theirs.
    rules = default.one("ClusterRole", CONTROLLER)["rules"]
    assert {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]} in rules
    assert {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]} in rules
    assert {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get"]} in rules
    assert all(rule["apiGroups"] in ([""], ["batch"], ["jobset.x-k8s.io"]) for rule in rules), rules


def test_cordon_permission_only_when_enabled(option_sets: dict[str, Rendered]) -> None:
    rendered = option_sets["cordon"]
    cordon = rendered.one("ClusterRole", f"{CONTROLLER}-cordon")
    assert cordon["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    binding = rendered.one("ClusterRoleBinding", f"{CONTROLLER}-cordon")
    # The controller cordons; the agents (one on every node) never get write access to nodes.
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": NAMESPACE}]
    assert all(rule["verbs"] != ["patch"] for rule in rendered.one("ClusterRole", AGENT)["rules"])


def test_external_postgres_from_a_secret(option_sets: dict[str, Rendered]) -> None:
    rendered = option_sets["external-postgres"]
    (controller,) = containers(rendered.controller)
    assert "--database" not in controller["args"], "the URL holds a password: never a flag"
    assert env_of(controller)["TOPO_TUNE_DATABASE_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "topo-tune-db", "key": "url"}
    }
    assert rendered.all("PersistentVolumeClaim") == []
    assert volumes_of(rendered.controller)["data"] == {"name": "data", "emptyDir": {}}
    assert rendered.controller["spec"]["replicas"] == 2
    assert "external, URL from Secret topo-tune-db" in rendered.notes


def test_several_replicas_elect_a_leader_on_the_releases_lease(option_sets: dict[str, Rendered]) -> None:
    rendered = option_sets["external-postgres"]  # two replicas on PostgreSQL
    (controller,) = containers(rendered.controller)
    env = env_of(controller)
    assert env["TOPO_TUNE_LEADER_ELECTION"]["value"] == "true"
    assert env["TOPO_TUNE_LEASE_NAME"]["value"] == CONTROLLER
    assert env["TOPO_TUNE_LEASE_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["TOPO_TUNE_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Every replica is Ready (helm --wait, rollout status); the Service selects the leader's pod label.
    assert controller["readinessProbe"]["grpc"] == {"port": 50051}
    assert controller["livenessProbe"]["grpc"] == {"port": 50051}
    service = rendered.one("Service", CONTROLLER)
    pods = rendered.controller["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == {**pods, LEADER_LABEL: "true"}
    # One pod at a time: a new pod stands by until the leader it replaces lets go; a drain keeps a standby.
    assert rendered.controller["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert rendered.one("PodDisruptionBudget", CONTROLLER)["spec"]["maxUnavailable"] == 1

    role = rendered.one("Role", f"{CONTROLLER}-leader-election")
    lease = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
    assert role["rules"] == [
        {**lease, "verbs": ["create"]},
        {**lease, "resourceNames": [CONTROLLER], "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
    ]
    binding = rendered.one("RoleBinding", f"{CONTROLLER}-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": NAMESPACE}]
    assert "-L topo-tune.io/leader" in rendered.notes


def test_with_mtls_the_probes_use_the_plaintext_health_port() -> None:
    values = {**ci_values()["external-postgres"], **ci_values()["mtls"]}
    (controller,) = containers(render(values).controller)
    assert controller["readinessProbe"]["grpc"] == {"port": 50052}
    assert controller["livenessProbe"]["grpc"] == {"port": 50052}
    assert env_of(controller)["TOPO_TUNE_LEADER_ELECTION"]["value"] == "true"


def test_two_releases_in_one_namespace_never_share_a_lease() -> None:
    values = ci_values()["external-postgres"]
    leases = {}
    for release in ("tt", "tt-canary"):
        rendered = render(values, release=release)
        name = env_of(containers(rendered.controller)[0])["TOPO_TUNE_LEASE_NAME"]["value"]
        (role,) = rendered.all("Role")
        assert role["rules"][1]["resourceNames"] == [name], "each release may renew its own Lease only"
        leases[release] = name
    assert leases == {"tt": "tt-topo-tune-controller", "tt-canary": "tt-canary-topo-tune-controller"}


def test_one_replica_on_postgres_leads_alone_and_never_overlaps() -> None:
    rendered = render({"database": {"external": {"enabled": True, "existingSecret": "db"}}})
    (controller,) = containers(rendered.controller)
    assert not {"TOPO_TUNE_LEADER_ELECTION", "TOPO_TUNE_LEASE_NAME"} & env_of(controller).keys()
    assert rendered.all("Role") == []
    # Without election a surge pod would act beside the old one on the same database, unfenced.
    assert rendered.controller["spec"]["strategy"] == {"type": "Recreate"}
    assert rendered.one("PodDisruptionBudget", CONTROLLER)["spec"]["maxUnavailable"] == 1


def _disruptions_allowed(budget: dict[str, Any], *, expected: int, healthy: int) -> int:
    """Kubernetes' disruption controller: evictions allowed = healthy pods - desired healthy pods."""

    def count(value: int | str) -> int:
        return math.ceil(int(value.rstrip("%")) * expected / 100) if isinstance(value, str) else value

    spec = budget["spec"]
    desired = expected - count(spec["maxUnavailable"]) if "maxUnavailable" in spec else count(spec["minAvailable"])
    return max(0, healthy - max(0, desired))


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_the_budget_lets_a_drain_evict_one_controller_at_a_time(replicas: int) -> None:
    values = {"database": {"external": {"enabled": True, "existingSecret": "db"}}, "controller": {"replicas": replicas}}
    rendered = render(values)
    selector = rendered.controller["spec"]["selector"]["matchLabels"]
    (budget,) = [b for b in rendered.all("PodDisruptionBudget") if b["spec"]["selector"]["matchLabels"] == selector]
    # Every replica is Ready: `kubectl drain` may evict one (the leader's node too), never all at once.
    assert _disruptions_allowed(budget, expected=replicas, healthy=replicas) == 1
    # With one of several already gone, the budget holds the rest until it is back.
    if replicas > 1:
        assert _disruptions_allowed(budget, expected=replicas, healthy=replicas - 1) == 0


def test_mtls_with_plaintext_health_port(option_sets: dict[str, Rendered]) -> None:
    rendered = option_sets["mtls"]
    (controller,) = containers(rendered.controller)
    flags = flag_values(controller["args"])
    assert flags["--tls-cert"] == "/etc/topo-tune/tls/tls.crt"
    assert flags["--tls-key"] == "/etc/topo-tune/tls/tls.key"
    assert flags["--tls-client-ca"] == "/etc/topo-tune/tls/ca.crt"
    assert flags["--health-listen"] == "0.0.0.0:50052"
    # kubelet's gRPC probes cannot present a client certificate: they must use the plaintext port.
    assert controller["livenessProbe"]["grpc"] == {"port": 50052}
    assert controller["readinessProbe"]["grpc"] == {"port": 50052, "service": READINESS_SERVICE}  # one replica
    assert {p["name"]: p["containerPort"] for p in controller["ports"]}["health"] == 50052
    assert volumes_of(rendered.controller)["tls"]["secret"]["secretName"] == "topo-tune-controller-tls"
    assert mounts_of(controller)["/etc/topo-tune/tls"]["readOnly"] is True

    for client, secret in (
        (rendered.agent, "topo-tune-agent-tls"),
        (rendered.test_pod, "topo-tune-agent-tls"),
    ):
        (container,) = containers(client)
        client_flags = flag_values(container["args"])
        assert client_flags["--tls-ca"] == "/etc/topo-tune/tls/ca.crt"
        assert client_flags["--tls-cert"] == "/etc/topo-tune/tls/tls.crt"
        assert client_flags["--tls-key"] == "/etc/topo-tune/tls/tls.key"
        assert volumes_of(client)["tls"]["secret"]["secretName"] == secret

    policy = rendered.one("NetworkPolicy", CONTROLLER)
    health_rules = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "health"]
    assert health_rules == [{"ports": [{"port": "health", "protocol": "TCP"}]}]


def test_tls_without_client_certificates() -> None:
    rendered = render({"tls": {"enabled": True, "existingSecret": "ctl-tls", "requireClientCert": False}})
    (controller,) = containers(rendered.controller)
    assert "--tls-client-ca" not in controller["args"]
    (agent,) = containers(rendered.agent)
    flags = flag_values(agent["args"])
    assert flags["--tls-ca"] == "/etc/topo-tune/tls/ca.crt"
    assert "--tls-cert" not in flags
    assert volumes_of(rendered.agent)["tls"]["secret"]["secretName"] == "ctl-tls"


def test_service_monitor_scrapes_the_metrics_port(default: Rendered, option_sets: dict[str, Rendered]) -> None:
    assert default.all("ServiceMonitor") == []  # off by default: the CRD may not exist
    rendered = option_sets["servicemonitor"]
    monitor = rendered.one("ServiceMonitor", CONTROLLER)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"] == rendered.one("Service", CONTROLLER)["spec"]["selector"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    service_ports = {p["name"] for p in rendered.one("Service", CONTROLLER)["spec"]["ports"]}
    assert endpoint["port"] in service_ports


def test_custom_rack_label_and_fixed_rack(option_sets: dict[str, Rendered]) -> None:
    (agent,) = containers(option_sets["rack-label"].agent)
    assert env_of(agent)["TOPO_TUNE_RACK_LABEL"]["value"] == "example.com/rack"
    (fixed,) = containers(render({"agent": {"rack": "rack-07"}}).agent)
    env = env_of(fixed)
    assert env["TOPO_TUNE_RACK"]["value"] == "rack-07"
    assert "TOPO_TUNE_RACK_LABEL" not in env


def test_network_policies_admit_only_this_release(default: Rendered) -> None:
    policy = default.one("NetworkPolicy", CONTROLLER)
    grpc_rule, metrics_rule = policy["spec"]["ingress"]
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    agent_selector = default.agent["spec"]["selector"]["matchLabels"]
    assert {"podSelector": {"matchLabels": agent_selector}} in grpc_rule["from"]
    test_labels = default.test_pod["metadata"]["labels"]
    test_peers = [peer["podSelector"]["matchLabels"] for peer in grpc_rule["from"]]
    assert any(peer.items() <= test_labels.items() for peer in test_peers), "helm test must reach the controller"
    assert "from" not in metrics_rule  # any scraper by default
    agents = default.one("NetworkPolicy", AGENT)
    assert agents["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": agent_selector}}]}]

    on_host = render({"agent": {"hostNetwork": True}})
    assert on_host.find("NetworkPolicy", AGENT) is None  # policies do not apply to host-network pods
    assert pod_spec(on_host.agent)["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_helm_test_hook_runs_admin_nodes(default: Rendered) -> None:
    pod = default.test_pod
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = containers(pod)
    assert container["args"] == ["admin", "nodes", "--controller", CONTROLLER_ADDRESS, "--output", "json"]
    assert env_of(container)["TOPO_TUNE_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{RELEASE}-topo-tune-token",
        "key": "token",
    }
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["restartPolicy"] == "Never"


def test_notes_tell_how_to_reach_the_controller(default: Rendered) -> None:
    assert f"helm test {RELEASE} --namespace {NAMESPACE}" in default.notes
    assert f"port-forward service/{CONTROLLER} 50051:50051" in default.notes
    assert f"get secret {RELEASE}-topo-tune-token" in default.notes


def test_agent_can_be_disabled() -> None:
    rendered = render({"agent": {"enabled": False}})
    assert rendered.all("DaemonSet") == []
    assert rendered.find("ServiceAccount", AGENT) is None
    assert rendered.find("ClusterRole", AGENT) is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"database": {"sqlite": {"persistence": {"enabled": False}}}},
            "topo-tune: no database configured. Keep database.sqlite.persistence.enabled=true",
        ),
        (
            {"database": {"external": {"enabled": True}}},
            "database.external.enabled=true needs database.external.existingSecret",
        ),
        ({"controller": {"replicas": 3}}, "controller.replicas=3 needs database.external.enabled=true"),
        ({"tls": {"enabled": True}}, "tls.enabled=true needs tls.existingSecret"),
        (
            {"controller": {"ports": {"metrics": 50051}}},
            "controller.ports.grpc (50051), controller.ports.metrics (50051)",
        ),
        ({"agent": {"rackLabel": "", "rack": ""}}, "the agents need a rack"),
        (
            {"agent": {"hostPaths": {"stateDir": "/etc/nccl/topo-tune/"}}},
            "agent.hostPaths.configDir and agent.hostPaths.stateDir must be different",
        ),
        (
            {"clusterConfig": {"apiVersion": "topo-tune/v1", "backend": "sim"}},
            "clusterConfig.backend is set by the chart from agent.backend",
        ),
        (
            {"clusterConfig": {"apiVersion": "topo-tune/v1", "controller": {"listen": "0.0.0.0:1"}}},
            "clusterConfig.controller.listen is set by the chart",
        ),
    ],
    ids=[
        "no-database",
        "external-without-secret",
        "replicas-on-sqlite",
        "tls-without-secret",
        "port-clash",
        "no-rack",
        "shared-host-dir",
        "cluster-backend",
        "cluster-controller-listen",
    ],
)
def test_invalid_values_fail_with_the_charts_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as failure:
        render(values)
    assert message in str(failure.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"agent": {"backend": "mpi"}}, "at '/agent/backend': value must be one of 'nccl', 'gloo', 'sim'"),
        ({"agent": {"tolerationz": []}}, "additional properties 'tolerationz' not allowed"),
        ({"controller": {"ports": {"grpc": 70000}}}, "at '/controller/ports/grpc': maximum"),
        ({"agent": {"hostPaths": {"configDir": "relative/dir"}}}, "at '/agent/hostPaths/configDir'"),
        ({"clusterConfig": {"apiVersion": "v2"}}, "at '/clusterConfig/apiVersion'"),
    ],
    ids=["unknown-backend", "misspelt-key", "port-range", "relative-host-path", "cluster-api-version"],
)
def test_schema_rejects_bad_values_naming_the_field(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as failure:
        render(values)
    assert message in str(failure.value)


def test_logging_settings_reach_every_topo_tune_process() -> None:
    rendered = render({"logging": {"level": "debug", "format": "json"}})
    for workload in (rendered.controller, rendered.agent, rendered.test_pod):
        env = env_of(containers(workload)[0])
        assert env["TOPO_TUNE_LOG_FORMAT"]["value"] == "json"
        assert env["TOPO_TUNE_LOG_LEVEL"]["value"] == "debug"
