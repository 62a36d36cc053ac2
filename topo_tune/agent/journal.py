"""The agent's journal: which commands it has taken, their results, and which results were delivered.

It is what makes execution at-most-once while delivery is at-least-once: a command id seen before is never
run again (its stored result is re-sent instead), and a result stays in the journal until the controller
acknowledges it, across reconnects and agent restarts. A command found ``running`` when the agent starts
was interrupted by a crash; it is finished as ``failed`` rather than run a second time.

SQLite (standard library) gives atomic, durable writes without a server; the file lives in the agent's
state directory. Taking a command and storing its result are synced to disk before the method returns
(``synchronous=FULL``); marking a result delivered is atomic but not synced on its own (the next take or
result syncs it): a power cut can lose only that mark, and the controller answers a re-sent result it already
has with another acknowledgement. Every write survives the agent's process being killed. Rows whose result
the controller acknowledged are pruned past the newest ``keep_delivered``: an acknowledged command is final at
the controller and never sent again, so the journal stays bounded on an agent that runs for years.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from topo_tune.security.private_files import private_dir, private_sqlite
from topo_tune.v1 import agent_pb2


class Entry(StrEnum):
    NEW = "new"  # never seen: run it
    RUNNING = "running"  # already running: do nothing
    DONE = "done"  # finished: re-send its result


@dataclass(frozen=True)
class Taken:
    entry: Entry
    result: agent_pb2.CommandResult | None = None


class Journal:
    """Thread-safe; every method commits before it returns (see the module's note on what is synced)."""

    def __init__(self, path: Path, *, keep_delivered: int = 1000) -> None:
        private_dir(path.parent)  # the state directory: the agent's alone
        private_sqlite(path)
        self._keep_delivered = keep_delivered
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS commands (id TEXT PRIMARY KEY, status TEXT NOT NULL, "
            "result BLOB, delivered INTEGER NOT NULL DEFAULT 0, taken_at REAL NOT NULL)"
        )
        # Pruning finds the oldest acknowledged rows by this index instead of sorting the table each time.
        self._db.execute("CREATE INDEX IF NOT EXISTS commands_delivered ON commands (delivered, taken_at, id)")
        self._db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        (self._delivered_rows,) = self._db.execute("SELECT COUNT(*) FROM commands WHERE delivered = 1").fetchone()

    def take(self, command_id: str) -> Taken:
        """Claim a command for execution, atomically. Only ``Entry.NEW`` means: run it now."""
        with self._lock:
            row = self._db.execute("SELECT status, result FROM commands WHERE id = ?", (command_id,)).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO commands (id, status, taken_at) VALUES (?, 'running', ?)",
                    (command_id, time.time()),
                )
                return Taken(Entry.NEW)
            if row[0] == "running":
                return Taken(Entry.RUNNING)
            return Taken(Entry.DONE, agent_pb2.CommandResult.FromString(row[1]))

    def finish(self, result: agent_pb2.CommandResult) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE commands SET status = 'done', result = ?, delivered = 0 WHERE id = ?",
                (result.SerializeToString(), result.command_id),
            )

    def delivered(self, command_id: str) -> None:
        with self._lock:
            self._db.execute("PRAGMA synchronous=NORMAL")  # the mark alone is not worth a sync (module docstring)
            try:
                with self._db:  # one transaction: the mark and the prune it allows
                    self._db.execute("BEGIN")
                    marked = self._db.execute(
                        "UPDATE commands SET delivered = 1 WHERE id = ? AND delivered = 0", (command_id,)
                    ).rowcount
                    self._delivered_rows += marked
                    surplus = self._delivered_rows - self._keep_delivered
                    if surplus > 0:
                        self._db.execute(
                            "DELETE FROM commands WHERE id IN (SELECT id FROM commands WHERE delivered = 1 "
                            "ORDER BY taken_at, id LIMIT ?)",
                            (surplus,),
                        )
                        self._delivered_rows -= surplus
            except BaseException:
                self._delivered_rows = self._db.execute("SELECT COUNT(*) FROM commands WHERE delivered = 1").fetchone()[
                    0
                ]
                raise
            finally:
                self._db.execute("PRAGMA synchronous=FULL")

    def undelivered(self) -> list[agent_pb2.CommandResult]:
        with self._lock:
            rows = self._db.execute(
                "SELECT result FROM commands WHERE status = 'done' AND delivered = 0 ORDER BY taken_at"
            ).fetchall()
        return [agent_pb2.CommandResult.FromString(r[0]) for r in rows]

    def interrupted(self) -> list[str]:
        """Commands left ``running`` by a previous agent process."""
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT id FROM commands WHERE status = 'running'")]

    def command_ids(self) -> list[str]:
        """Every command the journal still holds, oldest first."""
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT id FROM commands ORDER BY taken_at, id")]

    def get_state(self, key: str, default: str = "") -> str:
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else default

    def set_state(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
