"""What a result records as its effective NCCL settings: the C environment NCCL reads, not Python's copy.

NCCL loads ``nccl.conf`` into the process environment with ``setenv`` while it initialises; a worker
that reported ``os.environ`` would miss every value that came from such a file.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest

from topo_tune.agent.bench.worker import process_environ

_KEY = "NCCL_TOPO_TUNE_TEST_FROM_CONF"


@pytest.fixture
def set_like_nccl_conf() -> Iterator[None]:
    libc = ctypes.CDLL(None)
    assert libc.setenv(_KEY.encode(), b"4", 0) == 0  # what NCCL's initEnv does per nccl.conf line
    try:
        yield
    finally:
        libc.unsetenv(_KEY.encode())


def test_a_value_set_the_way_nccl_conf_is_loaded_is_recorded(set_like_nccl_conf: None) -> None:
    assert _KEY not in os.environ, "Python's snapshot never sees it"
    seen = process_environ()
    assert seen[_KEY] == "4"
    # Everything Python started with is there too, with the same values.
    assert {k: seen.get(k) for k in os.environ} == dict(os.environ)
