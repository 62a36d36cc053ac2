"""Who may call what: the admin, agent and job credentials, how they are issued, and the guard that checks them.

Three roles. The **admin** token (``--token-file``) may call everything. An **agent** credential is bound to
one node: it opens the agent service's session and may register only as that node, so a stolen node token
cannot pose as, or disconnect, another node. A **job** credential (``topo-tune env`` / ``exec``) may only ask
for a job's pinned config (``ResolveJobConfig``) and record the runs of its own A/B (``RecordJobComparison``,
``exec --compare``): no benchmark, command or config push, and no reading of other jobs' comparisons.

Agent credentials are derived from the admin token with HMAC-SHA256 (``topo-tune-agent:NODE:MAC``). Job
credentials are one per tenant: each holds a random nonce and an optional **scope**, a job-id prefix
(``topo-tune-job:NONCE:MAC:SCOPE``, the MAC over both), so every one is distinct, is checked without a
lookup, and acts for the job ids its scope allows only; what it pins or records belongs to it (``tenancy``).
The controller issues them (``topo-tune admin credential issue``) and replacing the admin token revokes every
one of them at once. Each issued credential is also recorded by its **id** (``credential_id``: a short hash of
the token, never the token itself), so one can be listed and revoked alone (``credential_ledger``): a revoked
id is refused at once, ``PERMISSION_DENIED`` naming it. Agent tokens are derived, so a node's revoked
credential stays revoked: that node gets a new one only with a new admin token; a revoked job credential is
replaced by issuing another. In a Kubernetes
cluster an agent may instead present its pod's projected service-account token, which the API server's
TokenReview binds to the pod's node (``kube/agent_identity.py``). The guard decides from the call's metadata
alone, before its body is read.

Non-goal: user identities.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import grpc

from topo_tune.controller import names
from topo_tune.security.auth import REFUSED, GuardInterceptor, presented_token

AGENT_SESSION = "/topo_tune.v1.AgentService/Session"
RESOLVE_JOB_CONFIG = "/topo_tune.v1.AdminService/ResolveJobConfig"
RECORD_JOB_COMPARISON = "/topo_tune.v1.AdminService/RecordJobComparison"
RECORD_JOB_TIMING = "/topo_tune.v1.AdminService/RecordJobTiming"
_AGENT_PREFIX = "topo-tune-agent:"
_JOB_PREFIX = "topo-tune-job:"
_KEY_LABEL = b"topo-tune credentials v1"
_NONCE_BYTES = 8
_HEX = frozenset("0123456789abcdef")


class Role(enum.Enum):
    ADMIN = "admin"
    AGENT = "agent"
    JOB = "job"


ALLOWED_METHODS: dict[Role, frozenset[str] | None] = {
    Role.ADMIN: None,  # everything
    Role.AGENT: frozenset({AGENT_SESSION}),
    Role.JOB: frozenset({RESOLVE_JOB_CONFIG, RECORD_JOB_COMPARISON, RECORD_JOB_TIMING}),
}


def credential_id(token: str | bytes) -> str:
    """The id an issued credential is listed and revoked by: 12 hex digits of its token's SHA-256."""
    data = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(data).hexdigest()[:12]


@dataclass(frozen=True)
class Credential:
    role: Role
    node_name: str = ""
    """For ``Role.AGENT``: the one node this credential registers as."""
    id: str = ""
    """For issued (agent, job) credentials: ``credential_id`` of the token."""
    scope: str = ""
    """For ``Role.JOB``: the job-id prefix it acts for ("" = any job id)."""

    def may_call(self, method: str) -> bool:
        allowed = ALLOWED_METHODS[self.role]
        return allowed is None or method in allowed

    def may_register_as(self, node_name: str) -> bool:
        return self.role is Role.ADMIN or (self.role is Role.AGENT and node_name == self.node_name)


class Credentials:
    """Issues agent and job credentials from the admin token and recognises all three kinds."""

    def __init__(
        self, admin_token: str, *, review_agent: Callable[[bytes], Awaitable[str | None]] | None = None
    ) -> None:
        self._admin = admin_token.encode()
        self.review_agent = review_agent
        """In a cluster: the node a Kubernetes service-account token of an agent pod is bound to, or None."""
        # A key of its own, so that no issued token reveals anything usable about the admin token.
        self._key = hmac.new(self._admin, _KEY_LABEL, hashlib.sha256).digest()
        self.revoked: set[str] = set()
        """Ids of revoked credentials (``credential_ledger`` keeps it, from the database)."""

    def _mac(self, role: Role, subject: str = "") -> str:
        return hmac.new(self._key, f"{role.value}\0{subject}".encode(), hashlib.sha256).hexdigest()

    def issue_agent(self, node_name: str) -> str:
        """The credential of ``node_name``'s agent (a valid node name, else ``ValidationError``)."""
        names.node_name(node_name, "node_name")
        return f"{_AGENT_PREFIX}{node_name}:{self._mac(Role.AGENT, node_name)}"

    def issue_job(self, scope: str = "", *, nonce: str = "") -> str:
        """A new job credential for the job ids starting with ``scope`` ("" = any): each call a distinct one
        (a random ``nonce`` unless given), so each tenant's can be revoked alone."""
        if scope:
            names.job_id(scope, "scope")
        nonce = nonce or secrets.token_hex(_NONCE_BYTES)
        return f"{_JOB_PREFIX}{nonce}:{self._job_mac(nonce, scope)}:{scope}"

    def _job_mac(self, nonce: str, scope: str) -> str:
        return self._mac(Role.JOB, f"{nonce}\0{scope}")

    def identify(self, token: bytes | None) -> Credential | None:
        """What ``token`` may do; None when it is no credential of this cluster."""
        if token is None:
            return None
        if hmac.compare_digest(token, self._admin):
            return Credential(Role.ADMIN)
        try:
            text = token.decode("ascii")
        except UnicodeDecodeError:
            return None
        if text.startswith(_AGENT_PREFIX):
            node_name, _, mac = text.removeprefix(_AGENT_PREFIX).rpartition(":")
            if node_name and hmac.compare_digest(mac, self._mac(Role.AGENT, node_name)):
                return Credential(Role.AGENT, node_name, credential_id(token))
        elif text.startswith(_JOB_PREFIX):
            nonce, _, rest = text.removeprefix(_JOB_PREFIX).partition(":")
            mac, _, scope = rest.partition(":")
            if nonce and set(nonce) <= _HEX and hmac.compare_digest(mac, self._job_mac(nonce, scope)):
                return Credential(Role.JOB, id=credential_id(token), scope=scope)
        return None

    def of_metadata(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Credential | None:
        """The admin, agent or job credential of a call's metadata (no Kubernetes review: for job calls)."""
        return self.identify(presented_token(tuple(metadata or ())))

    async def of_call(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Credential | None:
        """The credential of a call's metadata: one of ours, else (in a cluster) a reviewed agent pod's token."""
        token = presented_token(tuple(metadata or ()))
        credential = self.identify(token)
        if credential is None and token and self.review_agent is not None:
            node_name = await self.review_agent(token)
            if node_name:
                credential = Credential(Role.AGENT, node_name)
        return credential


class CredentialInterceptor(GuardInterceptor):
    """``UNAUTHENTICATED`` without a credential of this cluster; ``PERMISSION_DENIED`` outside its role."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    async def refusal(self, handler_call_details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        credential = await self._credentials.of_call(handler_call_details.invocation_metadata)
        if credential is None:
            return grpc.StatusCode.UNAUTHENTICATED, REFUSED
        method: str = handler_call_details.method
        if credential.id and credential.id in self._credentials.revoked:
            return grpc.StatusCode.PERMISSION_DENIED, f"credential {credential.id} was revoked"
        if not credential.may_call(method):
            return grpc.StatusCode.PERMISSION_DENIED, f"{credential.role.value} credentials may not call {method}"
        return None
