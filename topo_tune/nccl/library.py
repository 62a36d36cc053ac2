"""Asking a libnccl which NCCL it is (``ncclGetVersion``): a library file, or the one this process loaded.

The loaded one is what ran: ``torch.cuda.nccl.version()`` is the NCCL torch was *built* against, and on the H200
record it said 2.28.9 while every rank ran the 2.30.7 put where torch loads ``libnccl.so.2``.

Non-goals: finding which file the workers will load (the agent's discovery), loading NCCL for use.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["library_version", "loaded_version"]

SONAME = "libnccl.so.2"


def library_version(path: str) -> str | None:
    """The version of the libnccl at ``path`` (or found by that soname); None if absent or it does not answer."""
    try:
        return _asked(ctypes.CDLL(path))
    except OSError:
        return None


def loaded_version() -> str | None:
    """The version of the ``libnccl.so.2`` this process already loaded (by soname: an ``LD_PRELOAD``ed one too)."""
    try:
        lib = ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None  # not loaded
    return _asked(lib)


def _asked(lib: ctypes.CDLL) -> str | None:
    version = ctypes.c_int(0)
    try:
        if lib.ncclGetVersion(ctypes.byref(version)) != 0:
            return None
    except AttributeError:  # a library of that name without NCCL's entry point
        return None
    code = version.value
    # Since 2.9 the code is major*10000 + minor*100 + patch.
    return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"
