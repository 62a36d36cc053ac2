"""The ledger of issued credentials: each one recorded by id when issued, and revoked alone.

Purpose: agent and job credentials are derived from the admin token (``credentials``), so checking one needs
no lookup; the ledger adds what derivation cannot: which were handed out (id, role, node, when) and which are
revoked. A revocation is committed first, with an event in the node's history (``events``: ``credential.issued``
and ``credential.revoked``: the audit trail), then acted on: the id joins the set the
guard refuses with ``PERMISSION_DENIED`` from the next call on, and the node's open agent session is closed
with the same status, so the agent exits rather than retrying (``agent/backoff.py``).

``load`` fills that set from the database at the start of every leadership term (``Leadership`` runs it after
the term's epoch is claimed and before the first call is let in), so a credential revoked on the leader is
refused by whichever controller serves next. No refresh while serving is needed: a standby serves no agent or
admin call at all (``UNAVAILABLE``), and the fence (``db/fence.py``) orders every revocation either before the
successor's claim, so its ``load`` reads it, or refuses the revocation's commit, so the admin sees it fail.

Non-goals: the token format and the check (``credentials``), user identities.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.credentials import Credentials, Role, credential_id
from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import CredentialRow, EventRow
from topo_tune.controller.sessions import SessionHub
from topo_tune.errors import ConflictError, NotFoundError, ValidationError

logger = logging.getLogger(__name__)

_ID_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class IssuedRecord:
    id: str
    role: Role
    node_name: str
    scope: str
    issued_at: datetime
    revoked_at: datetime | None


def _record(row: CredentialRow) -> IssuedRecord:
    return IssuedRecord(row.id, Role(row.role), row.node_name, row.scope, row.issued_at, row.revoked_at)


@dataclass
class CredentialLedger:
    db: Database
    credentials: Credentials
    hub: SessionHub
    wall_clock: Callable[[], datetime]

    async def load(self) -> None:
        """The revoked ids, from the database: at the start of each term (alone: once, at start-up)."""
        rows = await self.db.read(
            lambda s: list(s.scalars(sa.select(CredentialRow.id).where(CredentialRow.revoked_at.is_not(None))))
        )
        self.credentials.revoked.update(rows)

    async def issue(self, role: Role, node_name: str = "", *, scope: str = "") -> tuple[str, IssuedRecord]:
        """A credential's token and its record; refused for an agent's revoked one (a derived token cannot
        change). A job credential is a new one each time, for the job ids starting with ``scope``."""
        token = self.credentials.issue_agent(node_name) if role is Role.AGENT else self.credentials.issue_job(scope)
        key = credential_id(token)
        now = self.wall_clock()

        def write(session: Session) -> IssuedRecord:
            row = session.get(CredentialRow, key)
            if row is not None and row.revoked_at is not None:
                raise ConflictError(
                    f"credential {key} (node {node_name!r}'s agent) was revoked; a new one needs a new admin token "
                    "(docs/security.md)"
                )
            if row is None:
                row = CredentialRow(
                    id=key, role=role.value, node_name=node_name, scope=scope, issued_at=now, revoked_at=None
                )
                session.add(row)
                message = f"credential {key} issued ({role.value})"
                session.add(EventRow(node_name=node_name, kind="credential.issued", message=message, at=now))
            session.flush()
            return _record(row)

        return token, await self.db.run(write)

    async def list(self) -> list[IssuedRecord]:
        rows = await self.db.read(
            lambda s: [_record(r) for r in s.scalars(sa.select(CredentialRow).order_by(CredentialRow.issued_at))]
        )
        return list(rows)

    async def revoke(self, key: str) -> IssuedRecord:
        """Revoke credential ``key``: committed with its event, then refused and its session closed."""
        if len(key) != 12 or not set(key) <= _ID_CHARS:
            raise ValidationError("id", f"expected the 12 hex digits `admin credential list` shows, got {key!r}")
        now = self.wall_clock()

        def write(session: Session) -> IssuedRecord:
            row = session.get(CredentialRow, key, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no credential {key} was issued by this controller (see admin credential list)")
            if row.revoked_at is None:
                row.revoked_at = now
                message = f"credential {key} revoked ({row.role})"
                session.add(EventRow(node_name=row.node_name, kind="credential.revoked", message=message, at=now))
            session.flush()
            return _record(row)

        record = await self.db.run(write)
        self.credentials.revoked.add(key)
        if record.role is Role.AGENT:
            self.hub.deny(record.node_name, credential_id=key, reason=f"credential {key} was revoked")
        logger.info("revoked credential %s", key, extra={"node": record.node_name})
        return record
