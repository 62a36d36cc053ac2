"""The credentials the controller issued, as the admin client hands them to its callers: domain values.

``admin credential issue|list|revoke`` read these, never the admin API's messages (converted here, at the
client's edge). Non-goals: checking tokens and storing the ledger (the controller's own).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from topo_tune.v1 import admin_pb2


class IssuedRole(enum.Enum):
    """What a credential the controller issues may do (the admin token's role is never issued)."""

    AGENT = "agent"
    """The agent service, registering as its one node only."""
    JOB = "job"
    """``env`` / ``exec`` / ``hostfile``: resolve a job's config and record its own A/B."""


ROLE_TO_WIRE = {IssuedRole.AGENT: admin_pb2.CREDENTIAL_ROLE_AGENT, IssuedRole.JOB: admin_pb2.CREDENTIAL_ROLE_JOB}


@dataclass(frozen=True)
class IssuedToken:
    """A new credential: its token (secret; shown once) and its id (what ``list`` shows, ``revoke`` takes)."""

    id: str
    token: str


@dataclass(frozen=True)
class CredentialEntry:
    """An issued credential as listed: its id, never its token."""

    id: str
    role: str
    """``agent`` or ``job`` (``admin``, ``unspecified``: what a newer controller may name)."""
    node_name: str
    scope: str
    """A job credential's job-id prefix (empty: any job id)."""
    issued_at: datetime
    revoked_at: datetime | None


def _instant(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def credential_entry(info: admin_pb2.CredentialInfo) -> CredentialEntry:
    return CredentialEntry(
        id=info.id,
        role=admin_pb2.CredentialRole.Name(info.role).removeprefix("CREDENTIAL_ROLE_").lower(),
        node_name=info.node_name,
        scope=info.scope,
        issued_at=_instant(info.issued_at),
        revoked_at=_instant(info.revoked_at) if info.HasField("revoked_at") else None,
    )
