"""Fixtures for the tuner-plugin tests: one build of the library per session, a table path per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugin.nccl_tuner_harness import TunerLibrary
from topo_tune.plugin import build_plugin


@pytest.fixture(scope="session")
def plugin_library_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build_plugin(tmp_path_factory.mktemp("plugin"))
    assert built.diagnostics == "", f"the plugin should compile without warnings:\n{built.diagnostics}"
    return built.path


@pytest.fixture
def tuner(plugin_library_path: Path) -> Iterator[TunerLibrary]:
    library = TunerLibrary(plugin_library_path)
    yield library
    library.finalize_all()


@pytest.fixture
def table_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A table path, exported in NCCL_TUNER_CONFIG_FILE as a job's environment would."""
    path = tmp_path / "tuner-table.csv"
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(path))
    yield path
