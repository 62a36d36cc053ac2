"""At start-up, work a previous controller process left ``running`` ends, once, with a message; nothing else."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from topo_tune.controller.db.database import Database
from topo_tune.controller.db.left_running import end_left_running
from topo_tune.controller.db.models import StudyRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)


def study(study_id: str, status: str) -> StudyRow:
    return StudyRow(id=study_id, status=status, request={}, nodes=["a"], created_at=T0, finished_at=None)


async def test_only_running_rows_end_with_the_status_and_message(sqlite_url: str) -> None:
    db = Database(sqlite_url)
    try:
        db.migrate()
        await db.run(lambda session: session.add_all([study("st-1", "running"), study("st-2", "succeeded")]))
        seen: list[str] = []

        def also(session: Session, row: StudyRow) -> None:
            seen.append(row.id)

        ended = await end_left_running(db, StudyRow, status="cancelled", message="restarted", at=T1, also=also)
        assert (ended, seen) == (1, ["st-1"])
        rows = await db.run(
            lambda session: {r.id: (r.status, r.message, r.finished_at) for r in session.query(StudyRow)}
        )
        assert rows == {"st-1": ("cancelled", "restarted", T1), "st-2": ("succeeded", "", None)}
        assert await end_left_running(db, StudyRow, status="cancelled", message="again", at=T1) == 0
    finally:
        db.close()
