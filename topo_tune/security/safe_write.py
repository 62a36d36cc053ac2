"""Writing a file a user named: whole or not at all, never through a symbolic link, its mode kept.

A command that writes into a directory other people can write to (a shared project directory, ``/tmp``) must
not let a symlink planted at the target, at a backup's name or at a predictable scratch name redirect the
write, and must not widen a file's mode (a 0600 ``cluster.yaml`` may hold a database URL). So the content goes
to a scratch file created exclusively under a random name in the target's directory (``O_CREAT | O_EXCL |
O_NOFOLLOW``: never an existing file, never a link), is synced, gets the target's mode, and is renamed over the
target, which replaces a directory entry and never follows one. A target that is a symlink is refused, so the
link's own target is never written either. A failure at any step removes the scratch file and leaves the old
file as it was.

Non-goals: files every user of a node reads (the agent's config store sets its own modes), state files that
are always private (``private_files``), and ownership: a file is written as the user running the command.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from topo_tune.errors import FileWriteError

__all__ = ["NEW_FILE_MODE", "SECRET_FILE_MODE", "StagedFile", "stage_file", "write_file"]

NEW_FILE_MODE = 0o644
"""A new file's mode when it holds nothing secret (reports, hostfiles, a config version's files)."""
SECRET_FILE_MODE = 0o600
"""A new file's mode when it holds a credential, or a configuration that may hold a database URL."""

_SCRATCH_MODE = 0o600  # until the content is whole, nobody else may read it, whatever the final mode


@dataclass(frozen=True, slots=True)
class StagedFile:
    """Content written whole beside ``target`` under a random name; :meth:`commit` renames it into place."""

    target: Path
    scratch: Path
    mode: int
    """The mode the file will have: the target's when it existed."""

    def commit(self) -> None:
        """Rename the scratch file over the target (atomic: readers see the old file or the new one)."""
        try:
            os.replace(self.scratch, self.target)
        except OSError as error:
            self.discard()
            raise FileWriteError(str(self.target), f"cannot write it: {error.strerror or error}") from None
        _sync_directory(self.target.parent)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.scratch)


def write_file(target: Path, content: str | bytes, *, new_mode: int = NEW_FILE_MODE, mode: int | None = None) -> None:
    """Replace ``target`` with ``content`` (text is UTF-8) as the module docstring says.

    The file keeps its mode when it exists; a new one gets ``new_mode``. ``mode`` sets the mode whatever the
    file had (a backup gets its original's). Raises :class:`~topo_tune.errors.FileWriteError` naming the path.
    """
    stage_file(target, content, new_mode=new_mode, mode=mode).commit()


def stage_file(
    target: Path, content: str | bytes, *, new_mode: int = NEW_FILE_MODE, mode: int | None = None
) -> StagedFile:
    """The first half of :func:`write_file`, for a caller that renames several files only once all are written."""
    existing = _existing_mode(target)
    final_mode = mode if mode is not None else new_mode if existing is None else existing
    data = content.encode("utf-8") if isinstance(content, str) else content
    scratch = target.with_name(f".{target.name}.{secrets.token_hex(8)}.partial")
    try:
        descriptor = os.open(
            scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _SCRATCH_MODE
        )
    except OSError as error:
        raise FileWriteError(str(target), f"cannot write in its directory: {error.strerror or error}") from None
    staged = StagedFile(target, scratch, final_mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
            os.fchmod(descriptor, final_mode)  # fchmod is not subject to the umask
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as error:
        staged.discard()
        raise FileWriteError(str(target), f"cannot write it: {error.strerror or error}") from None
    except BaseException:
        staged.discard()
        raise
    return staged


def _existing_mode(target: Path) -> int | None:
    """The mode of the regular file at ``target``, None when there is none; a symlink or another kind is refused."""
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise FileWriteError(str(target), f"cannot look at it: {error.strerror or error}") from None
    if stat.S_ISLNK(info.st_mode):
        raise FileWriteError(
            str(target), "is a symbolic link; refusing to write through it (remove it, or name its target)"
        )
    if not stat.S_ISREG(info.st_mode):
        raise FileWriteError(str(target), "exists and is not a regular file; refusing to replace it")
    return stat.S_IMODE(info.st_mode)


def _sync_directory(directory: Path) -> None:
    # The rename is durable only once the directory's entry is; a file system that cannot sync a directory
    # (some network ones) still renamed atomically, so that is not an error.
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
