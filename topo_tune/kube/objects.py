"""The few Kubernetes objects topo-tune reads or writes, as typed frozen records.

``api.py`` converts the client's models into these at the boundary, so the logic that uses them (idleness,
racks, leader election) is testable without the ``kubernetes`` package and without an API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class KubeNode:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    """``spec.unschedulable``: the node is cordoned (``kubectl cordon`` / drain)."""


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    phase: str
    """Pending, Running, Succeeded, Failed or Unknown."""
    labels: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, str] = field(default_factory=dict)
    """Resource name → a quantity its containers (init containers too) request or limit; non-zero if any is.

    Extended resources such as ``nvidia.com/gpu`` may be given as limits only (the request then defaults to
    the limit), so both count.
    """
    node_name: str = ""
    """``spec.nodeName``: the node the pod is bound to; empty while it is not scheduled."""


@dataclass(frozen=True)
class WorkloadInfo:
    """A Job or JobSet as a job's node lookup needs it: its uid and how many pods run at once."""

    kind: str
    """``Job`` or ``JobSet``."""
    namespace: str
    name: str
    uid: str
    pods: int
    """Pods that run together: a Job's parallelism (at most its completions); a JobSet's sum over its
    replicated jobs of replicas × parallelism."""


@dataclass(frozen=True)
class Lease:
    """A ``coordination.k8s.io/v1`` Lease as leader election uses it."""

    holder: str
    """``spec.holderIdentity``; empty when released."""
    lease_duration_s: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    """``spec.leaseTransitions``: how many times the holder changed; the cluster-wide leadership epoch."""
    resource_version: str = ""
    """``metadata.resourceVersion``: a write carrying an old one is refused with 409 Conflict."""


@dataclass(frozen=True)
class TokenReview:
    """What the API server says about a bearer token (``authentication.k8s.io/v1`` TokenReview)."""

    authenticated: bool
    username: str = ""
    audiences: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """E.g. ``authentication.kubernetes.io/node-name``: the node of the pod a projected token is bound to."""
