"""Tenancy: which job credential a job's pins and comparisons belong to, and what it may store.

A job credential (``credentials``) acts for the job ids its scope allows (a job-id prefix; "" = any). The first
pin of a job id records the credential that made it as the job's **owner**; from then on only that credential
(or the admin) may read the job's pins, pin another arm, or record the job's comparison, and a comparison
belongs to the credential that recorded it first. Another credential is refused with ``PERMISSION_DENIED``
naming only what it sent, never what is stored. Each job credential may own at most ``caps`` pins and
comparisons (``QuotaExceeded``, ``RESOURCE_EXHAUSTED``, checked before anything is written; the caps are
``controller.jobCaps`` in cluster.yaml).

Non-goals: checking tokens (``credentials``), deleting old rows (pins: the scheduler; comparisons:
``retention``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topo_tune.config.cluster import JobCapsConfig
from topo_tune.controller.credentials import Credential, Role
from topo_tune.errors import PermissionDenied, QuotaExceeded

ADMIN_OWNER = ""
"""The owner recorded for what the admin (or a controller without credentials) pins or records."""


def check_row_nodes(caps: JobCapsConfig, nodes: Sequence[str], field: str) -> None:
    """``QuotaExceeded`` naming the cap when ``nodes`` are more bytes than one pin or comparison may hold."""
    size = sum(len(node.encode()) for node in nodes)
    if size > caps.row_node_bytes:
        raise QuotaExceeded(
            f"{field}: {len(nodes)} node names of {size} bytes in all, more than one row's cap "
            f"(rowNodeBytes = {caps.row_node_bytes})"
        )


@dataclass(frozen=True)
class Tenant:
    """Who asks for a job's pin or records its comparison: the admin, or one job credential."""

    owner: str = ADMIN_OWNER
    """The job credential's id; ``ADMIN_OWNER`` for the admin."""
    scope: str = ""
    """The job-id prefix a job credential acts for ("" = any)."""

    @property
    def is_admin(self) -> bool:
        return self.owner == ADMIN_OWNER

    def check_job(self, job_id: str) -> None:
        """``PermissionDenied`` unless this tenant may act for ``job_id`` (its scope)."""
        if not job_id.startswith(self.scope):
            raise PermissionDenied(f"this job credential acts for job ids starting with {self.scope!r}, not {job_id!r}")

    def check_owner(self, job_id: str, owner: str | None) -> None:
        """``PermissionDenied`` when ``job_id``'s stored rows (owned by ``owner``; None: none yet) are another's."""
        if owner is not None and not self.is_admin and owner != self.owner:
            raise PermissionDenied(f"job {job_id!r} belongs to another credential")

    def check_count(self, owned: int, cap: int, what: str) -> None:
        """``QuotaExceeded`` naming the cap when this tenant already owns ``cap`` rows of ``what``."""
        if not self.is_admin and owned >= cap:
            raise QuotaExceeded(
                f"this job credential holds {owned} {what}, its cap ({what}PerCredential = {cap}); "
                "older ones are deleted by retention"
            )


ADMIN = Tenant()
CAPS = JobCapsConfig()
"""The default caps (``controller.jobCaps`` in cluster.yaml)."""


def tenant_of(credential: Credential | None) -> Tenant:
    """The tenant a call acts as: a job credential's own; the admin's for anything else (or no guard)."""
    if credential is None or credential.role is not Role.JOB:
        return ADMIN
    return Tenant(owner=credential.id, scope=credential.scope)
