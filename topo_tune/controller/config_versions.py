"""Config versions as the controller keeps them: stored once, never changed, looked up by content id.

``topo-tune init`` stores the version it produced; ``admin rollout create`` rolls a stored version out;
``admin config list|show|diff|export`` reads them. Storing the same files again is a no-op (same id). This is
the one place that writes config versions: the rollout store reaches them through it. The one thing about a
stored version that changes is its kill switch for learning (``set_learning``, outside the content id), each
change committed with an event (``version.learning``: the audit trail, ``admin events``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import ConfigVersionRow, EventRow
from topo_tune.errors import NotFoundError, ValidationError
from topo_tune.ids import ConfigVersionId
from topo_tune.versions.version import ConfigVersion, is_version_id

_WHY_LIMIT = 1024
"""The longest reason kept with a kill switch (the column's width)."""


@dataclass(frozen=True)
class StoredVersion:
    """A stored config version: its content id, files (empty in a listing), provenance and when it was stored."""

    id: str
    files: Mapping[str, str]
    provenance: Mapping[str, str]
    created_at: datetime
    learning_stopped: bool = False
    """The version's kill switch: set, its new jobs run the chosen table (``docs/learning.md``)."""
    learning_stopped_why: str = ""
    """Why the kill switch is set: who set it, or the job whose ranks' records disagreed."""


def _info(row: ConfigVersionRow, *, with_files: bool) -> StoredVersion:
    return StoredVersion(
        id=row.id,
        files=dict(row.files) if with_files else {},
        provenance=dict(row.provenance),
        created_at=row.created_at,
        learning_stopped=row.learning_stopped,
        learning_stopped_why=row.learning_stopped_why,
    )


@dataclass
class ConfigVersions:
    db: Database
    wall_clock: Callable[[], datetime]

    async def put(
        self, files: Mapping[str, str], provenance: Mapping[str, str], *, claimed_id: str = ""
    ) -> StoredVersion:
        """Validate and store files sent by an admin; ``claimed_id`` must be their hash when given."""
        version = ConfigVersion(files=files, provenance=provenance)  # validates names and nccl.conf
        if claimed_id and claimed_id != version.id:
            raise ValidationError("id", f"{claimed_id} is not the hash of these files ({version.id})")
        return await self.store(version)

    async def store(self, version: ConfigVersion) -> StoredVersion:
        """Store ``version`` unless it is stored already (the id is the content, so the first copy stands)."""
        now = self.wall_clock()

        def write(session: Session) -> ConfigVersionRow:
            row = session.get(ConfigVersionRow, version.id)
            if row is None:
                row = ConfigVersionRow(
                    id=version.id, files=dict(version.files), provenance=dict(version.provenance), created_at=now
                )
                session.add(row)
                session.flush()
            return row

        return _info(await self.db.run(write), with_files=True)

    async def files(self, version_id: ConfigVersionId) -> dict[str, str]:
        """The files of a stored version; ``NotFoundError`` names it when it is not stored."""
        row = await self.db.read(lambda session: session.get(ConfigVersionRow, version_id))
        if row is None:
            raise NotFoundError(f"no config version {version_id!r}")
        return dict(row.files)

    async def get(self, version_id: ConfigVersionId) -> StoredVersion:
        if not is_version_id(version_id):
            raise ValidationError("id", f"not a config version id (cv- and 16 hex digits): {version_id[:40]!r}")
        row = await self.db.read(lambda session: session.get(ConfigVersionRow, version_id))
        if row is None:
            raise NotFoundError(f"no config version {version_id!r}")
        return _info(row, with_files=True)

    async def set_learning(self, version_id: ConfigVersionId, *, stopped: bool, actor: str) -> StoredVersion:
        """Set or clear the version's kill switch, committed with its event; a no-op (no event) when unchanged.

        Jobs pinned already keep their arm: a pin is never changed under a running job."""
        if not is_version_id(version_id):
            raise ValidationError("id", f"not a config version id (cv- and 16 hex digits): {version_id[:40]!r}")
        now = self.wall_clock()

        def write(session: Session) -> ConfigVersionRow:
            row = set_learning_in(session, version_id, stopped=stopped, why=f"by {actor}", at=now)
            if row is None:
                raise NotFoundError(f"no config version {version_id!r}")
            return row

        return _info(await self.db.run(write), with_files=False)

    async def learning_stopped(self, version_id: ConfigVersionId) -> bool:
        """Whether the version's kill switch is set (False for NCCL's defaults and unknown versions)."""
        row = await self.db.read(lambda session: session.get(ConfigVersionRow, version_id))
        return row is not None and row.learning_stopped

    async def list(self, *, limit: int = 50) -> list[StoredVersion]:
        def read(session: Session) -> list[ConfigVersionRow]:
            query = sa.select(ConfigVersionRow).order_by(ConfigVersionRow.created_at.desc()).limit(limit)
            return list(session.scalars(query))

        return [_info(row, with_files=False) for row in await self.db.read(read)]


def set_learning_in(
    session: Session, version_id: str, *, stopped: bool, why: str, at: datetime
) -> ConfigVersionRow | None:
    """Set or clear the version's kill switch in the caller's transaction, with its ``version.learning`` event
    (``learning stopped for ID WHY``); unchanged, nothing is written and the first reason stands. None when
    there is no such version."""
    row = session.get(ConfigVersionRow, version_id, with_for_update=True)
    if row is None:
        return None
    if row.learning_stopped != stopped:
        row.learning_stopped = stopped
        row.learning_stopped_why = why[:_WHY_LIMIT] if stopped else ""
        message = f"learning {'stopped' if stopped else 'allowed'} for {version_id} {why}"
        session.add(EventRow(node_name="", kind="version.learning", message=message, at=at))
    session.flush()
    return row


def stop_learning_in(session: Session, version_id: str, *, why: str, at: datetime) -> None:
    """Set the version's kill switch in the caller's transaction (``set_learning_in``); no version, nothing."""
    set_learning_in(session, version_id, stopped=True, why=why, at=at)
