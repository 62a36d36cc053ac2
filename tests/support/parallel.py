"""How the suite is laid out for pytest-xdist workers (``pytest -n N --dist loadgroup``, as ``make test`` runs it).

Two rules, applied to the collected tests on every worker (all workers see the same order, as xdist requires):

- a module whose tests share a module- or class-scoped fixture (a cluster, a chart render, an ``init`` run)
  becomes one xdist group, so the fixture is built once, on one worker, not once per worker;
- the multi-process scenarios (markers ``slow``, ``netns``, ``faults``) are handed out first, so the minutes-long
  ones start while the thousands of quick tests fill the other workers, instead of starting last and running
  alone at the end.

pytest-xdist's ``loadgroup`` reads a test's group from a ``@group`` suffix of its id, which its own collection
hook adds by setting the item's ``_nodeid``; pytest 9.2 keeps the id in ``_id`` instead, so that suffix was lost
and every group spread over the workers (real Slurms at once, a module's cluster built once per worker). This
module's hook runs after xdist's and adds the suffix where it is missing.

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
        if item.get_closest_marker("xdist_group") is None and (
            isinstance(item, pytest.Function) and item.module.__name__ in shared
        ):  # a module that names its own group keeps it (e.g. every real Slurm shares one)
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        _put_group_in_id(item)
    items.sort(key=lambda item: not is_long(item))


def group_of(item: pytest.Item) -> str | None:
    """The xdist group of ``item`` as pytest-xdist names it (several groups joined by ``_``), or None."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


def _put_group_in_id(item: pytest.Item) -> None:
    group = group_of(item)
    if group is None or item.nodeid.endswith(f"@{group}"):
        return  # no group, or pytest-xdist's own hook added it (pytest before 9.2)
    tagged = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest 9.2: the id is a NodeId; parsing keeps this exact string as its text
        from _pytest.nodeid import coerce_node_id  # only pytest 9.2 and later have it

        item._id = coerce_node_id(tagged)
    else:
        item._nodeid = tagged
