"""The fault suite's long scenarios (``faults_long``) run only when asked for by name, so that the suite in a
plain ``pytest`` run (and CI) stays within a few minutes on two cores:
``pytest -m "faults or faults_long"`` (or ``python benchmarks/fault_suite.py``) runs every scenario.
Deselected, not skipped: they are not reported as passing when they did not run.
"""

from __future__ import annotations

import pytest

LONG = "faults_long"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if LONG in (config.getoption("markexpr") or ""):
        return
    long = [item for item in items if item.get_closest_marker(LONG) is not None]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if item.get_closest_marker(LONG) is None]
