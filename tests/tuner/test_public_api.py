"""The tuner's public names: every name a module's ``__all__`` promises exists."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "space",
    "objective",
    "statistics",
    "study",
    "outputs",
    "timeout_advice",
    "sim_evaluator",
    "coordinate_descent",
]


@pytest.mark.parametrize("name", MODULES)
def test_every_public_name_exists(name: str) -> None:
    module = importlib.import_module(f"topo_tune.tuner.{name}")
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, missing
