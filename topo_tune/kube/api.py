"""The Kubernetes API calls topo-tune makes, through the ``kubernetes`` client, returning typed records.

This is the only module that imports ``kubernetes``; callers import it lazily, only in Kubernetes mode.
Every client exception is converted here into ``KubernetesError`` (with the HTTP status), so callers see one
exception type. Calls block: asyncio callers run them in a worker thread.

Calls: read a node, list the pods bound to a node (field selector ``spec.nodeName``) or carrying a label,
read a Job or a JobSet, read/create/replace a Lease, review a service-account token (TokenReview). Writes
carry ``metadata.resourceVersion`` so the API server refuses a stale one with 409 Conflict.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from topo_tune.errors import KubernetesError
from topo_tune.kube.environment import KubeEnvironment
from topo_tune.kube.objects import KubeNode, Lease, PodInfo, TokenReview, WorkloadInfo

LEASE_API_VERSION = "coordination.k8s.io/v1"
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"


def _read_token(path: Path) -> str:
    return path.read_text(encoding="utf-8").strip()


def _api_message(body: object) -> str:
    # The API server answers errors with a Status object; its `message` says what was wrong.
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return str(status["message"])
    return str(body or "")[:200]


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except ApiException as error:
        detail = _api_message(error.body)
        raise KubernetesError(
            f"{what}: {error.status} {error.reason}" + (f": {detail}" if detail else ""), status=error.status
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise KubernetesError(f"{what}: {error}") from None


def _micro_time(value: datetime | None) -> datetime | None:
    # The client writes datetimes with isoformat(), which drops the fraction at microsecond 0; the API
    # server parses MicroTime with exactly six fractional digits and would refuse that value.
    if value is not None and value.microsecond == 0:
        return value.replace(microsecond=1)
    return value


class KubeApi:
    """A connection to one API server, as one identity (token)."""

    def __init__(self, api_client: client.ApiClient, *, request_timeout_s: float) -> None:
        self._client = api_client
        self._core = client.CoreV1Api(api_client)
        self._coordination = client.CoordinationV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._authentication = client.AuthenticationV1Api(api_client)
        self._timeout = request_timeout_s

    @classmethod
    def connect(cls, environment: KubeEnvironment) -> KubeApi:
        configuration = client.Configuration(host=environment.api_url)
        configuration.retries = 0  # callers retry on their own schedule (leader election's retry period)
        if environment.ca_file is not None:
            configuration.ssl_ca_cert = str(environment.ca_file)
        token_file = environment.token_file
        if token_file is not None:
            with _translated(f"reading the service-account token {token_file}"):
                configuration.api_key["BearerToken"] = _read_token(token_file)
            configuration.api_key_prefix["BearerToken"] = "Bearer"

            def refresh(configuration: client.Configuration) -> None:
                # Projected service-account tokens are rotated by kubelet; always send the current one.
                configuration.api_key["BearerToken"] = _read_token(token_file)

            configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]  # annotated as None only
        return cls(client.ApiClient(configuration), request_timeout_s=environment.request_timeout_s)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def review_token(self, token: str, *, audiences: list[str]) -> TokenReview:
        """Ask the API server who ``token`` is (it must be valid for one of ``audiences``)."""
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=audiences))
        with _translated("reviewing a service-account token"):
            review = self._authentication.create_token_review(body, _request_timeout=self._timeout)
        status = review.status
        if status is None or not status.authenticated:
            return TokenReview(authenticated=False)
        user = status.user
        return TokenReview(
            authenticated=True,
            username=str(user.username or "") if user else "",
            audiences=tuple(status.audiences or ()),
            extra={k: tuple(v or ()) for k, v in ((user.extra or {}) if user else {}).items()},
        )

    def read_node(self, name: str) -> KubeNode:
        with _translated(f"reading node {name}"):
            node = self._core.read_node(name, _request_timeout=self._timeout)
        return KubeNode(
            name=name,
            labels=dict(node.metadata.labels or {}) if node.metadata else {},
            unschedulable=bool(node.spec and node.spec.unschedulable),
        )

    def pods_on_node(self, node_name: str) -> list[PodInfo]:
        with _translated(f"listing the pods on node {node_name}"):
            pods = self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node_name}", _request_timeout=self._timeout
            )
        return [_pod(pod) for pod in pods.items]

    def pods_labelled(self, selector: str) -> list[PodInfo]:
        """The pods in every namespace matching a label selector (``key=value``)."""
        with _translated(f"listing the pods with {selector}"):
            pods = self._core.list_pod_for_all_namespaces(label_selector=selector, _request_timeout=self._timeout)
        return [_pod(pod) for pod in pods.items]

    def read_job(self, namespace: str, name: str) -> WorkloadInfo:
        with _translated(f"reading job {namespace}/{name}"):
            job = self._batch.read_namespaced_job(name, namespace, _request_timeout=self._timeout)
        spec = job.spec
        parallelism = spec.parallelism if spec and spec.parallelism is not None else 1
        if spec and spec.completions is not None:
            parallelism = min(parallelism, spec.completions)
        uid = (job.metadata.uid or "") if job.metadata else ""
        return WorkloadInfo("Job", namespace, name, uid, parallelism)

    def read_jobset(self, namespace: str, name: str) -> WorkloadInfo:
        with _translated(f"reading jobset {namespace}/{name}"):
            found = self._custom.get_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, "jobsets", name, _request_timeout=self._timeout
            )
        if not isinstance(found, dict):
            raise KubernetesError(f"reading jobset {namespace}/{name}: the API server answered {type(found).__name__}")
        pods = 0
        for replicated in found.get("spec", {}).get("replicatedJobs", []) or []:
            job_spec = replicated.get("template", {}).get("spec", {}) or {}
            parallelism = job_spec.get("parallelism", 1)
            if job_spec.get("completions") is not None:
                parallelism = min(parallelism, job_spec["completions"])
            pods += int(replicated.get("replicas", 1)) * int(parallelism)
        return WorkloadInfo("JobSet", namespace, name, str(found.get("metadata", {}).get("uid", "")), pods)

    def label_pod(self, namespace: str, name: str, *, key: str, value: str | None) -> None:
        """Set one label on a pod, or remove it (``None``): a JSON merge patch, so no other label is touched."""
        with _translated(f"labelling pod {namespace}/{name}"):
            self._core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": {"labels": {key: value}}},
                _content_type="application/merge-patch+json",
                _request_timeout=self._timeout,
            )

    def read_lease(self, namespace: str, name: str) -> Lease | None:
        """The Lease, or None when it does not exist (yet)."""
        try:
            with _translated(f"reading lease {namespace}/{name}"):
                lease = self._coordination.read_namespaced_lease(name, namespace, _request_timeout=self._timeout)
        except KubernetesError as error:
            if error.status == 404:
                return None
            raise
        return _lease(lease)

    def create_lease(self, namespace: str, name: str, lease: Lease) -> Lease:
        """Create the Lease; ``KubernetesError`` with status 409 when another candidate created it first."""
        with _translated(f"creating lease {namespace}/{name}"):
            created = self._coordination.create_namespaced_lease(
                namespace, _body(namespace, name, lease), _request_timeout=self._timeout
            )
        return _lease(created)

    def replace_lease(self, namespace: str, name: str, lease: Lease) -> Lease:
        """Write the Lease if it is still at ``lease.resource_version``; status 409 when someone wrote first."""
        if not lease.resource_version:
            raise ValueError("replacing a lease needs the resourceVersion it was read at")
        with _translated(f"updating lease {namespace}/{name}"):
            replaced = self._coordination.replace_namespaced_lease(
                name, namespace, _body(namespace, name, lease), _request_timeout=self._timeout
            )
        return _lease(replaced)


def _pod(pod: client.V1Pod) -> PodInfo:
    resources: dict[str, str] = {}
    spec = pod.spec
    containers = [*(spec.containers or []), *(spec.init_containers or [])] if spec else []
    for container in containers:
        if container.resources is None:
            continue
        for amounts in (container.resources.requests or {}, container.resources.limits or {}):
            for resource, quantity in amounts.items():
                if resources.get(resource, "0") == "0":
                    resources[resource] = str(quantity)
    metadata = pod.metadata
    return PodInfo(
        namespace=(metadata.namespace or "") if metadata else "",
        name=(metadata.name or "") if metadata else "",
        phase=(pod.status.phase or "Unknown") if pod.status else "Unknown",
        labels=dict(metadata.labels or {}) if metadata else {},
        resources=resources,
        node_name=(spec.node_name or "") if spec else "",
    )


def _lease(lease: client.V1Lease) -> Lease:
    spec = lease.spec or client.V1LeaseSpec()
    return Lease(
        holder=spec.holder_identity or "",
        lease_duration_s=spec.lease_duration_seconds or 0,
        acquire_time=spec.acquire_time,
        renew_time=spec.renew_time,
        transitions=spec.lease_transitions or 0,
        resource_version=(lease.metadata.resource_version or "") if lease.metadata else "",
    )


def _body(namespace: str, name: str, lease: Lease) -> client.V1Lease:
    return client.V1Lease(
        api_version=LEASE_API_VERSION,
        kind="Lease",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, resource_version=lease.resource_version or None),
        spec=client.V1LeaseSpec(
            holder_identity=lease.holder or None,
            lease_duration_seconds=lease.lease_duration_s,
            acquire_time=_micro_time(lease.acquire_time),
            renew_time=_micro_time(lease.renew_time),
            lease_transitions=lease.transitions,
        ),
    )
