"""Work a previous controller process left ``running``: ended at start-up, before this process takes any.

A study, probe round or drift check runs inside the controller process that started it; when that process
stops (restart, lost leadership) the work stops with it, but its row still says ``running``. The next leader
ends such rows once, while it loads the database, with a status and a message that say what happened and
what the user can do. Non-goal: benchmark jobs, which run on the agents and can still end on their own
(``BenchmarkJobs.recover`` finishes them from their stored results).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.db.database import Database
from topo_tune.controller.db.models import DriftCheckRow, ProbeRoundRow, StudyRow

RUNNING = "running"

Row = TypeVar("Row", StudyRow, ProbeRoundRow, DriftCheckRow)


async def end_left_running(
    db: Database,
    row_type: type[Row],
    *,
    status: str,
    message: str,
    at: datetime,
    also: Callable[[Session, Row], None] | None = None,
) -> int:
    """End every ``row_type`` row still ``running`` as ``status`` with ``message``, at ``at``; ``also`` runs for each
    row in the same transaction. Returns how many rows were ended."""

    def write(session: Session) -> int:
        rows = list(session.scalars(sa.select(row_type).where(row_type.status == RUNNING)))
        for row in rows:
            row.status, row.finished_at, row.message = status, at, message
            if also is not None:
                also(session, row)
        return len(rows)

    return await db.run(write)
