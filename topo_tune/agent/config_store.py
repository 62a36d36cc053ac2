"""The node's staged config versions and the one that is active, changed atomically and crash-safely.

Layout under the config directory (default ``/etc/nccl/topo-tune``)::

    versions/cv-0123456789abcdef/nccl.conf     one immutable directory per version
    active -> versions/cv-0123456789abcdef     the active pointer (a relative symlink)
    jobs.lock                                  jobs hold a shared lock on it while they run

A job pinned to a version reads ``versions/<id>/nccl.conf`` (it never changes under the job); a job that
follows whatever is active reads ``active/nccl.conf``. A version is staged by writing its files into a fresh
temporary directory (each file written, fsynced and closed), fsyncing that directory and renaming it to
``versions/<id>``; it becomes active by creating a temporary symlink and renaming it over ``active``, then
fsyncing the config directory (kubelet's AtomicWriter does the same with ``..data``). A process killed at
any point therefore leaves either the old or the new version fully active, never a mix; leftovers of an
interrupted apply are removed by :meth:`ConfigStore.recover`.

Everything is validated before the first byte is written: file names come from the allow-list of
``config_version.FILE_NAMES`` (so no name can leave the directory), the version id must be the hash of the
files, and ``nccl.conf`` may only set what the env policy allows in a version (``config_version.check_settings``).
Files are opened with ``O_NOFOLLOW | O_EXCL`` inside a directory this process just created, and a staged
version that is a symlink or whose content no longer matches its id is refused, so a planted symlink cannot
redirect a write.

Non-goals: deciding which version a node should run (the controller's rollout does) and keeping jobs off
the node (``busy`` predicates report them; the caller decides what busy means).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import shutil
import socket
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from topo_tune.errors import ConfigWriteError, ConflictError, StoreBusy, ValidationError
from topo_tune.ids import NO_CONFIG_VERSION, ConfigVersionId
from topo_tune.security.private_files import set_own_mode
from topo_tune.versions import node_names
from topo_tune.versions.layout import ACTIVE_LINK, JOBS_LOCK, VERSIONS_DIR, staged_path
from topo_tune.versions.version import (
    NCCL_CONF,
    check_files,
    check_settings,
    is_version_id,
    parse_nccl_conf,
    version_id,
)

logger = logging.getLogger(__name__)

EXPECTED_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
"""What the file system says when the directory cannot take a version now: full, over quota, read-only, denied."""
_STAGING_PREFIX = ".staging-"
SHARED_DIR = 0o755
SHARED_FILE = 0o644
"""The modes of the config directory, its versions and their files, set whatever the umask: jobs of every user
read them (``topo-tune exec`` checks a version's content before it starts a rank), only the agent writes."""
_LINK_PREFIX = ".active-"


def check_version(version: ConfigVersionId, files: Mapping[str, str], *, config_dir: Path | None = None) -> None:
    """Everything :meth:`ConfigStore.apply` checks before it writes; names the offending field."""
    if version == "":
        if files:
            raise ValidationError("version", "empty (NCCL's defaults) but files were given")
        return
    if not is_version_id(version):
        raise ValidationError("version", f"{version!r} is not a config version id (cv- and 16 hex digits)")
    for name in files:
        # check_files refuses these too; a separate message makes an escape attempt obvious in the logs.
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            raise ValidationError(f"files[{name!r}]", "a file name, not a path: it must stay in the config directory")
    check_files(files)
    if NCCL_CONF in files:
        check_settings(parse_nccl_conf(files[NCCL_CONF], strict=True), config_dir=config_dir)
    if version_id(files) != version:
        raise ValidationError("version", f"{version} is not the hash of the files given ({version_id(files)})")


@dataclass(frozen=True)
class Applied:
    version: str
    previous: str
    changed: bool
    """False when the version was already active and intact (applying it again does nothing)."""


Busy = Callable[[], str | None]
"""Returns why the node must not change now (a benchmark, a job), or None when it may."""


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """An expected OS error while writing under ``path`` becomes ``ConfigWriteError`` naming the path."""
    try:
        yield
    except OSError as error:
        if error.errno not in EXPECTED_WRITE_ERRORS:
            raise
        raise ConfigWriteError(
            f"cannot write {error.filename or path}: {os.strerror(error.errno)}", errno=error.errno
        ) from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ConfigStore:
    """The config directory of one node. Not thread-safe: the agent applies one version at a time."""

    def __init__(self, root: Path, *, keep: int = 5, step: Callable[[str], None] = lambda _name: None) -> None:
        if keep < 2:
            raise ValueError("keep: at least 2 (the active version and the one to roll back to)")
        self.root = root
        self.keep = keep
        self._step = step  # called between the steps of an apply; crash tests kill the process there
        self.versions = root / VERSIONS_DIR
        self.active_link = root / ACTIVE_LINK
        self.jobs_lock = root / JOBS_LOCK

    # -- reading ------------------------------------------------------------------------------------------

    def active_version(self) -> ConfigVersionId:
        """The active version's id, or "" when none is active (NCCL's defaults)."""
        try:
            target = os.readlink(self.active_link)
        except FileNotFoundError:
            return NO_CONFIG_VERSION
        except OSError as error:
            if error.errno == errno.EINVAL:  # not a symlink: something else sits at 'active'
                raise ConflictError(f"{self.active_link} is not a symlink; refusing to trust it") from None
            raise
        head, _, name = target.partition("/")
        if head != VERSIONS_DIR or not is_version_id(name):
            raise ConflictError(f"{self.active_link} points at {target!r}, not at a staged version")
        return name

    def staged(self) -> list[str]:
        """Staged version ids, oldest first (by when they were last activated)."""
        if not self.versions.is_dir():
            return []
        found = [p for p in self.versions.iterdir() if is_version_id(p.name) and not p.is_symlink() and p.is_dir()]
        return [p.name for p in sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))]

    def path_of(self, version: ConfigVersionId, name: str = NCCL_CONF) -> Path:
        """Where a staged version's file lives: the stable path a job pinned to it reads."""
        if not is_version_id(version):
            raise ValidationError("version", f"{version!r} is not a config version id")
        return staged_path(self.root, version, name)

    def read(self, version: ConfigVersionId) -> dict[str, str]:
        """A staged version's files, checked against its id (ConflictError when missing or tampered with)."""
        directory = self.versions / version
        try:
            info = os.lstat(directory)
        except FileNotFoundError:
            raise ConflictError(f"version {version} is not staged on this node") from None
        if not stat.S_ISDIR(info.st_mode):
            raise ConflictError(f"{directory} is not a directory")
        files: dict[str, str] = {}
        for entry in os.scandir(directory):
            if not entry.is_file(follow_symlinks=False):
                raise ConflictError(f"{directory} holds {entry.name!r}, which is not a plain file")
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, encoding="utf-8") as handle:
                files[entry.name] = handle.read()
        if version_id(files) != version:
            raise ConflictError(f"staged version {version} does not match its id; it was changed after staging")
        return files

    def damage(self) -> str:
        """Why the active version's files no longer hash to its id ("" when intact or when none is active).

        Anything that rewrote, added or removed a file of the active version (a job's debug file, an operator's
        edit) is found here; the agent reports it with every heartbeat until the controller re-applies it.
        """
        try:
            version = self.active_version()
            if version:
                self.read(version)
        except ConflictError as error:
            return str(error)
        return ""

    def damage_of_file(self, path: str) -> str:
        """Why the staged version that ``path`` lies in (``versions/<id>/...`` or ``active/...``) no longer matches
        its id; "" when it does, or when ``path`` is not in a staged version (a gate's or a trial's
        ``NCCL_CONF_FILE`` is checked this way before its ranks start)."""
        real = Path(os.path.realpath(path))
        if real.parent.parent != Path(os.path.realpath(self.versions)) or not is_version_id(real.parent.name):
            return ""
        try:
            self.read(real.parent.name)
        except ConflictError as error:
            return str(error)
        return ""

    # -- changing -----------------------------------------------------------------------------------------

    def recover(self) -> None:
        """Remove what an interrupted apply left behind (staging directories, temporary links)."""
        for directory in (self.root, self.versions):
            directory.mkdir(parents=True, exist_ok=True)
            set_own_mode(directory, SHARED_DIR)  # 0777 when made under umask 000: anyone could plant a version
        if not self.jobs_lock.exists():
            self.jobs_lock.touch()
            os.chmod(self.jobs_lock, SHARED_FILE)  # jobs of any user take a shared lock on it, read-only
        for entry in self.versions.iterdir():
            if entry.name.startswith(_STAGING_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)
        for entry in self.root.iterdir():
            if entry.name.startswith(_LINK_PREFIX):
                entry.unlink(missing_ok=True)

    def record_node_name(self, name: str, *, host: str = "") -> None:
        """Record the name this node's agent registers as, for jobs on ``host`` (default: this host's name);
        agents sharing the directory keep their own lines (``versions/node_names.py``)."""
        node_names.record(self.root, host=host or socket.gethostname(), name=name)

    def apply(self, version: ConfigVersionId, files: Mapping[str, str], *, busy: Busy = lambda: None) -> Applied:
        """Stage ``version`` (if needed) and make it active. ``version=""`` with no files deactivates.

        Raises ``ValidationError`` before writing anything when the request is bad, ``StoreBusy`` when
        ``busy`` or a running job says the node must not change now, and ``ConfigWriteError`` (naming the path)
        when the directory cannot be written (a full disk, a quota, read-only): the old version stays active
        and nothing half-written is left behind.
        """
        check_version(version, files, config_dir=self.root)
        with _writing(self.root):
            return self._apply(version, files, busy=busy)

    def _apply(self, version: ConfigVersionId, files: Mapping[str, str], *, busy: Busy) -> Applied:
        self.recover()
        previous = self.active_version()
        if previous == version and (not version or not self.damage()):
            return Applied(version, previous, changed=False)
        if previous == version:
            # Same id, other content: the files were changed after staging. Stage them again from ``files``.
            logger.warning("active config version %s does not match its id: %s; re-staging it", version, self.damage())
            with self._no_jobs(busy):
                self._stage(version, files)
                self._step("repaired")
            return Applied(version, previous, changed=True)
        with self._no_jobs(busy):
            if version:
                self._stage(version, files)
                self._activate(version)
            else:
                self.active_link.unlink(missing_ok=True)
                _fsync_dir(self.root)
            self._step("activated")
        self._prune(keep_also=previous)
        logger.info("config version %s active (was %s)", version or "defaults", previous or "defaults")
        return Applied(version, previous, changed=True)

    @contextlib.contextmanager
    def _no_jobs(self, busy: Busy) -> Iterator[None]:
        reason = busy()
        if reason:
            raise StoreBusy(f"not changing the config now: {reason}")
        fd = os.open(self.jobs_lock, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreBusy("not changing the config now: a job on this node holds it") from None
            yield  # while we hold it exclusively, no job can start and read a half-made choice
        finally:
            os.close(fd)

    def _stage(self, version: ConfigVersionId, files: Mapping[str, str]) -> None:
        final = self.versions / version
        if os.path.lexists(final):
            try:
                self.read(version)
                os.utime(final, follow_symlinks=False)  # retention counts from the last activation
                return
            except ConflictError:
                logger.warning("staged version %s is damaged; staging it again", version)
                if final.is_symlink() or not final.is_dir():
                    final.unlink()
                else:
                    shutil.rmtree(final)
        staging = self._mkdtemp()
        try:
            self._write_staging(staging, files)
            try:
                os.rename(staging, final)
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                self.read(version)  # another process staged the same version meanwhile: fine if it is intact
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # a failed write (a full disk) leaves no staging behind
            raise
        _fsync_dir(self.versions)
        self._step("renamed")

    def _write_staging(self, staging: Path, files: Mapping[str, str]) -> None:
        for name, content in sorted(files.items()):
            with _writing(staging / name):
                fd = os.open(staging / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SHARED_FILE)
                os.fchmod(fd, SHARED_FILE)  # whatever the umask: every job reads it, none may write it
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(content)
                    handle.flush()
                    os.fsync(handle.fileno())
            self._step(f"wrote {name}")
        os.chmod(staging, SHARED_DIR)  # private (0700) while it was written; readable by jobs once complete
        _fsync_dir(staging)
        self._step("staged")

    def _mkdtemp(self) -> Path:
        while True:
            candidate = self.versions / f"{_STAGING_PREFIX}{secrets.token_hex(6)}"
            try:
                candidate.mkdir(mode=0o700)
            except FileExistsError:
                continue
            return candidate

    def _activate(self, version: ConfigVersionId) -> None:
        link = self.root / f"{_LINK_PREFIX}{secrets.token_hex(6)}"
        with _writing(link):
            os.symlink(f"{VERSIONS_DIR}/{version}", link)
        self._step("linked")
        os.rename(link, self.active_link)  # atomic: readers see the old or the new target, nothing between
        self._step("swapped")
        _fsync_dir(self.root)

    def _prune(self, *, keep_also: str) -> None:
        """Keep the ``keep`` most recently activated versions, always the active one and its predecessor."""
        active = self.active_version()
        staged = self.staged()
        excess = len(staged) - self.keep
        for old in staged:
            if excess <= 0:
                break
            if old in (active, keep_also):
                continue
            shutil.rmtree(self.versions / old, ignore_errors=True)
            excess -= 1
            logger.info("pruned staged config version %s", old)


def jobs_lock_shared(root: Path) -> int | None:
    """Hold a shared lock on a node's ``jobs.lock`` for as long as the returned fd stays open.

    Returns None when the node has no config store (no agent installed); blocks while an apply runs.
    """
    try:
        fd = os.open(root / JOBS_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd
