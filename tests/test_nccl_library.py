"""Asking a libnccl its version: nothing is claimed where no NCCL answers (this machine has none loaded)."""

from __future__ import annotations

import ctypes.util

from topo_tune.nccl.library import library_version, loaded_version


def test_no_version_from_a_missing_file_or_a_library_that_is_not_nccl() -> None:
    assert library_version("/nonexistent/libnccl.so.2") is None
    libc = ctypes.util.find_library("c")
    assert libc is not None
    assert library_version(libc) is None  # loads, but has no ncclGetVersion


def test_nothing_is_reported_loaded_when_this_process_loaded_no_libnccl() -> None:
    assert loaded_version() is None
