"""What a result records as its effective NCCL settings: the C environment NCCL reads, not Python's copy.

NCCL loads ``nccl.conf`` into the process environment with ``setenv`` while it initialises; a worker
that reported ``os.environ`` would miss every value that came from such a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from topo_tune.agent.bench import worker
from topo_tune.agent.bench.worker import process_environ
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.nccl.backends import Backend

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


def test_what_nccl_adds_from_etc_nccl_conf_is_recorded_even_where_nccl_never_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NCCL reads /etc/nccl.conf after NCCL_CONF_FILE, whatever that says; a trial on "defaults" gets its keys.
    system = tmp_path / "nccl.conf"
    system.write_text("NCCL_IB_HCA=mlx5_0\nNCCL_DEBUG=INFO\n")
    job_conf = tmp_path / "job.conf"
    job_conf.write_text("NCCL_DEBUG=WARN\n")
    monkeypatch.setattr(worker, "SYSTEM_NCCL_CONF", system)
    monkeypatch.setenv("NCCL_CONF_FILE", str(job_conf))
    spec = cast(BenchmarkSpec, SimpleNamespace(env={"NCCL_CONF_FILE": str(job_conf)}))
    env = worker._effective_env(spec, Backend.GLOO)
    assert env["NCCL_IB_HCA"] == "mlx5_0" and env["NCCL_DEBUG"] == "WARN"
    assert env["topo_tune.system_nccl_conf_sha256"] == hashlib.sha256(system.read_bytes()).hexdigest()
    monkeypatch.setattr(worker, "SYSTEM_NCCL_CONF", tmp_path / "absent")
    env = worker._effective_env(spec, Backend.GLOO)
    assert "NCCL_IB_HCA" not in env and env["topo_tune.system_nccl_conf_sha256"] == "absent"
