"""A small tmpfs for disk-full faults: mounted for one test, filled to the last byte, emptied, unmounted.

Needs root (``mount``), as the network-namespace tests do; without it the test fails, never skips.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

FILLER = ".filler"


@dataclass(frozen=True)
class SmallDisk:
    """A mounted tmpfs of ``size_bytes``."""

    root: Path
    size_bytes: int

    def fill(self) -> int:
        """Write a filler file until the file system is full (ENOSPC); returns the bytes written."""
        written = 0
        with (self.root / FILLER).open("ab", buffering=0) as filler:
            for size in (1 << 20, 4096, 1):  # big steps first, then to the last page
                chunk = b"\0" * size
                while True:
                    try:
                        written += filler.write(chunk)
                    except OSError as error:
                        if error.errno != errno.ENOSPC:
                            raise
                        break
        return written

    def free(self) -> None:
        """Space returns: the filler goes."""
        (self.root / FILLER).unlink(missing_ok=True)

    def available(self) -> int:
        stat = os.statvfs(self.root)
        return stat.f_bavail * stat.f_frsize


@contextmanager
def small_disk(root: Path, *, size_bytes: int) -> Iterator[SmallDisk]:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(root)], check=True)
    try:
        yield SmallDisk(root, size_bytes)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
