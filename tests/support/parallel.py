"""How the suite is laid out for pytest-xdist workers (``pytest -n N --dist loadgroup``, as ``make test`` runs it).

Two rules, applied to the collected tests on every worker (all workers see the same order, as xdist requires):

- a module whose tests share a module- or class-scoped fixture (a cluster, a chart render, an ``init`` run)
  becomes one xdist group, so the fixture is built once, on one worker, not once per worker;
- the multi-process scenarios (markers ``slow``, ``netns``, ``faults``) are handed out first, so the minutes-long
  ones start while the thousands of quick tests fill the other workers, instead of starting last and running
  alone at the end.

Non-goals: timing each test (the markers say enough), isolation between workers (each test's own job: ports
bound to 0, files under ``tmp_path``, names with a random part; docs/testing.md).
"""

from __future__ import annotations

import pytest

LONG_MARKERS = ("slow", "netns", "faults")
"""Markers of tests that take seconds to minutes each."""

_SHARED_SCOPES = ("module", "class")


def shares_a_fixture(item: pytest.Item) -> bool:
    """``item`` uses a fixture that lives longer than one test but not the whole session."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(definitions[-1].scope in _SHARED_SCOPES for definitions in info.name2fixturedefs.values() if definitions)


def is_long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) is not None for name in LONG_MARKERS)


def schedule_for_workers(items: list[pytest.Item]) -> None:
    """Group the modules that share a fixture and move the long tests to the front (stable, in place)."""
    shared = {item.module.__name__ for item in items if isinstance(item, pytest.Function) and shares_a_fixture(item)}
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue  # a module that names its own group (e.g. every real Slurm shares one)
        if isinstance(item, pytest.Function) and item.module.__name__ in shared:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=lambda item: not is_long(item))
