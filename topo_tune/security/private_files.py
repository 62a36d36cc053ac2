"""State files only their owner may read: files 0600 and directories 0700, whatever the umask.

The controller's SQLite database (topology, versions, results) and an agent's journal and state directory
are nobody else's business, yet created the usual way they come out 0644 and 0755 (or 0666 and 0777 under
``umask 000``). Here they are created with their final mode and set to it explicitly (``chmod`` is not
subject to the umask); one that already exists and belongs to this user is narrowed to it. SQLite creates a
database's ``-wal``, ``-shm`` and ``-journal`` files with the database file's own mode, so creating the
database file first, 0600, makes them 0600 too.

Non-goals: files other users must read (the config store's versions, which jobs of every user open: it sets
its own modes with ``set_own_mode``), and directories that are not ours alone (a database's parent directory
is the operator's).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def set_own_mode(path: Path, mode: int) -> None:
    """Set ``path``'s mode (``chmod`` ignores the umask) if it belongs to this user and is no symlink."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        return  # not ours to change (an operator's symlink or directory)
    if stat.S_IMODE(info.st_mode) != mode:
        os.chmod(path, mode)


def private_dir(path: Path) -> Path:
    """``path`` as a directory of mode 0700 (its missing parents are created the usual way)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=PRIVATE_DIR)
    set_own_mode(path, PRIVATE_DIR)
    return path


def private_file(path: Path) -> Path:
    """``path`` as a file of mode 0600: created empty when missing (its directory must exist)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
    except FileExistsError:
        set_own_mode(path, PRIVATE_FILE)
        return path
    try:
        os.fchmod(descriptor, PRIVATE_FILE)
    finally:
        os.close(descriptor)
    return path


def private_sqlite(database: str | Path | None) -> None:
    """A SQLite database file (a URL's database part), and the side files SQLite derives from it, mode 0600.

    In-memory databases and ``file:`` URIs are left alone; a file that cannot be created is left to SQLite,
    whose own error says why."""
    if not database or str(database) == ":memory:" or str(database).startswith("file:"):
        return
    path = Path(database)
    with contextlib.suppress(OSError):
        private_file(path)
        for suffix in SQLITE_SIDE_FILES:
            side = path.with_name(path.name + suffix)
            if os.path.lexists(side):
                set_own_mode(side, PRIVATE_FILE)
