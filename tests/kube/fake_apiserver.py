"""A small in-process Kubernetes API server: just the endpoints topo-tune calls, with the real semantics.

Served over HTTP on 127.0.0.1 (port 0) by a thread, so that the real ``kubernetes`` client talks to it over
a socket. Implemented: GET a node; list pods across namespaces by ``fieldSelector=spec.nodeName=…``; a JSON
merge patch of a pod's labels; Lease GET/POST/PUT with ``resourceVersion`` optimistic concurrency (409
Conflict on a stale write, 409 AlreadyExists on a second create), MicroTime fields checked with the API
server's own format (six fractional digits), bearer tokens checked (401), and errors as ``Status`` objects.

For fault injection a token can be made *unreachable* (every request with it gets 503, as through a broken
network path or an overloaded API server) or *stalled* (requests hang until released), so one candidate of a
leader election can stop renewing while the others carry on.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
LEASE_PATH = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?$")
NODE_PATH = re.compile(r"^/api/v1/nodes/([^/]+)$")
POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")
WORKLOAD_PATH = re.compile(r"^/apis/(batch/v1|jobset\.x-k8s\.io/v1alpha2)/namespaces/([^/]+)/(jobs|jobsets)/([^/]+)$")
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


class _Refused(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass
class FakeApiServer:
    tokens: set[str] = field(default_factory=set)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    workloads: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    """(plural: jobs or jobsets, namespace, name) → the Job or JobSet object."""
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)
    stalled: set[str] = field(default_factory=set)
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    """(method, path with query, token) of every request, in order."""
    reviewable: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Token → the TokenReview ``status.user`` it authenticates as, with the audiences it was issued for."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(100))
    _release: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None

    # -- set-up helpers -------------------------------------------------------------------------------------

    def add_node(self, name: str, *, labels: dict[str, str] | None = None, unschedulable: bool = False) -> None:
        spec = {"unschedulable": True} if unschedulable else {}
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels or {}, "resourceVersion": self._next_version()},
            "spec": spec,
        }

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        phase: str = "Running",
        labels: dict[str, str] | None = None,
        requests: dict[str, str] | None = None,
        limits: dict[str, str] | None = None,
        init_limits: dict[str, str] | None = None,
    ) -> None:
        def container(cname: str, requests: dict[str, str] | None, limits: dict[str, str] | None) -> dict[str, Any]:
            resources: dict[str, Any] = {}
            if requests:
                resources["requests"] = requests
            if limits:
                resources["limits"] = limits
            return {"name": cname, "image": "busybox", "resources": resources}

        spec: dict[str, Any] = {"containers": [container("main", requests, limits)]}
        if node:
            spec["nodeName"] = node
        if init_limits:
            spec["initContainers"] = [container("init", None, init_limits)]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": spec,
            "status": {"phase": phase},
        }
        with self._lock:
            self.pods.append(pod)

    def add_job(self, namespace: str, name: str, *, uid: str, parallelism: int, completions: int | None = None) -> None:
        spec: dict[str, Any] = {"parallelism": parallelism, "template": {"spec": {"containers": []}}}
        if completions is not None:
            spec["completions"] = completions
        with self._lock:
            self.workloads[("jobs", namespace, name)] = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "spec": spec,
            }

    def add_jobset(self, namespace: str, name: str, *, uid: str, replicated: list[tuple[int, int]]) -> None:
        """``replicated``: (replicas, parallelism) per replicated job."""
        jobs = [
            {"name": f"rj{i}", "replicas": replicas, "template": {"spec": {"parallelism": parallelism}}}
            for i, (replicas, parallelism) in enumerate(replicated)
        ]
        with self._lock:
            self.workloads[("jobsets", namespace, name)] = {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "spec": {"replicatedJobs": jobs},
            }

    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        """The scheduler's part: bind a pending pod to a node."""
        with self._lock:
            pod = next(
                p for p in self.pods if p["metadata"]["namespace"] == namespace and p["metadata"]["name"] == name
            )
            pod["spec"]["nodeName"] = node

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            stored = self.leases.get((namespace, name))
            return json.loads(json.dumps(stored)) if stored else None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_PUT(self) -> None:
                fake._handle(self, "PUT")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True).start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def release_stalled(self) -> None:
        self._release.set()

    # -- request handling -----------------------------------------------------------------------------------

    def _next_version(self) -> str:
        return str(next(self._versions))

    def _handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
        with self._lock:
            self.requests.append((method, request.path, token))
        if token in self.stalled:
            self._release.wait(60)
        try:
            if token in self.unreachable:
                raise _Refused(503, "ServiceUnavailable", "the server is currently unable to handle the request")
            if token not in self.tokens:
                raise _Refused(401, "Unauthorized", "Unauthorized")
            length = int(request.headers.get("Content-Length") or 0)
            body = json.loads(request.rfile.read(length)) if length else None
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            code, payload = self._route(method, request.path, body, content_type)
        except _Refused as refused:
            code, payload = refused.code, _status(refused)
        data = json.dumps(payload).encode()
        request.send_response(code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def _route(self, method: str, raw_path: str, body: Any, request_type: str) -> tuple[int, dict[str, Any]]:
        url = urllib.parse.urlsplit(raw_path)
        query = urllib.parse.parse_qs(url.query)
        with self._lock:
            if method == "GET" and (match := NODE_PATH.match(url.path)):
                node = self.nodes.get(match[1])
                if node is None:
                    raise _Refused(404, "NotFound", f'nodes "{match[1]}" not found')
                return 200, node
            if method == "GET" and url.path == "/api/v1/pods":
                return 200, self._list_pods(query)
            if method == "GET" and (match := WORKLOAD_PATH.match(url.path)):
                found = self.workloads.get((match[3], match[2], match[4]))
                if found is None:
                    raise _Refused(404, "NotFound", f'{match[3]} "{match[4]}" not found')
                return 200, found
            if method == "PATCH" and (match := POD_PATH.match(url.path)):
                return self._patch_pod(match[1], match[2], body, request_type)
            if match := LEASE_PATH.match(url.path):
                return self._lease_call(method, match[1], match[2], body)
            if method == "POST" and url.path == TOKEN_REVIEWS:
                return 201, self._review(body)
        raise _Refused(404, "NotFound", f"the server could not find the requested resource ({method} {url.path})")

    def add_service_account_token(
        self, token: str, *, namespace: str, name: str, node: str | None, audiences: tuple[str, ...] = ("topo-tune",)
    ) -> None:
        """A projected service-account token of a pod on ``node`` (None: a token without node information)."""
        extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
        self.reviewable[token] = {
            "user": {"username": f"system:serviceaccount:{namespace}:{name}", "extra": extra},
            "audiences": list(audiences),
        }

    def _review(self, body: Any) -> dict[str, Any]:
        spec = body.get("spec", {}) if isinstance(body, dict) else {}
        known = self.reviewable.get(str(spec.get("token", "")))
        wanted = set(spec.get("audiences") or [])
        if known is None or (wanted and not wanted & set(known["audiences"])):
            status: dict[str, Any] = {"authenticated": False, "error": "invalid bearer token"}
        else:
            status = {
                "authenticated": True,
                "user": known["user"],
                "audiences": sorted(wanted & set(known["audiences"])),
            }
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec, "status": status}

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = [p for p in self.pods if p["metadata"]["name"] == name and p["metadata"]["namespace"] == namespace]
            return json.loads(json.dumps(found[0])) if found else None

    def _patch_pod(self, namespace: str, name: str, body: Any, content_type: str) -> tuple[int, dict[str, Any]]:
        """A JSON merge patch of the pod's labels (``null`` removes one); anything else is refused."""
        if content_type != "application/merge-patch+json":
            raise _Refused(415, "UnsupportedMediaType", f"this fake takes merge patches only, got {content_type!r}")
        if not isinstance(body, dict) or set(body) != {"metadata"} or set(body["metadata"]) != {"labels"}:
            raise _Refused(422, "Invalid", f"this fake patches metadata.labels only, got {body!r}")
        found = [p for p in self.pods if p["metadata"]["name"] == name and p["metadata"]["namespace"] == namespace]
        if not found:
            raise _Refused(404, "NotFound", f'pods "{name}" not found')
        labels = found[0]["metadata"].setdefault("labels", {})
        for key, value in body["metadata"]["labels"].items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        return 200, found[0]

    def _list_pods(self, query: dict[str, list[str]]) -> dict[str, Any]:
        selectors, labels = query.get("fieldSelector", []), query.get("labelSelector", [])
        if len(labels) == 1 and not selectors and labels[0].count("=") == 1:
            key, value = labels[0].split("=")
            items = [pod for pod in self.pods if pod["metadata"]["labels"].get(key) == value]
            return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}
        if len(selectors) != 1 or not selectors[0].startswith("spec.nodeName="):
            raise _Refused(
                400, "BadRequest", f"this fake supports fieldSelector=spec.nodeName=… or labelSelector=K=V, got {query}"
            )
        node = selectors[0].removeprefix("spec.nodeName=")
        items = [pod for pod in self.pods if pod["spec"].get("nodeName") == node]
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}

    def _lease_call(self, method: str, namespace: str, name: str | None, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "GET" and name:
            stored = self.leases.get((namespace, name))
            if stored is None:
                raise _Refused(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
            return 200, stored
        if method == "POST" and not name:
            lease = _valid_lease(body, namespace)
            key = (namespace, lease["metadata"]["name"])
            if key in self.leases:
                raise _Refused(409, "AlreadyExists", f'leases.coordination.k8s.io "{key[1]}" already exists')
            lease["metadata"].update(resourceVersion=self._next_version(), uid=f"uid-{key[1]}")
            self.leases[key] = lease
            return 201, lease
        if method == "PUT" and name:
            lease = _valid_lease(body, namespace)
            if lease["metadata"]["name"] != name:
                raise _Refused(400, "BadRequest", "the name of the object does not match the name on the URL")
            stored = self.leases.get((namespace, name))
            if stored is None:
                raise _Refused(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
            if lease["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                raise _Refused(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            lease["metadata"].update(resourceVersion=self._next_version(), uid=stored["metadata"]["uid"])
            self.leases[(namespace, name)] = lease
            return 200, lease
        raise _Refused(405, "MethodNotAllowed", f"{method} is not supported here")


def _valid_lease(body: Any, namespace: str) -> dict[str, Any]:
    if not isinstance(body, dict) or body.get("kind", "Lease") != "Lease":
        raise _Refused(400, "BadRequest", "expected a Lease")
    metadata = body.get("metadata") or {}
    if not metadata.get("name"):
        raise _Refused(422, "Invalid", "metadata.name: Required value")
    if metadata.get("namespace", namespace) != namespace:
        raise _Refused(400, "BadRequest", "the namespace of the provided object does not match the namespace sent")
    spec = body.get("spec") or {}
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and MICRO_TIME.match(value)):
            raise _Refused(400, "BadRequest", f"spec.{key}: parsing time {value!r} as RFC3339 with microseconds")
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        raise _Refused(422, "Invalid", "spec.leaseDurationSeconds: must be greater than 0")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": metadata["name"],
            "namespace": namespace,
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "spec": spec,
    }


def _status(refused: _Refused) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": refused.message,
        "reason": refused.reason,
        "code": refused.code,
    }
