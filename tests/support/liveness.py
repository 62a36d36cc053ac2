"""How long the controller let a node stay silent before it declared it lost, by the controller's own clock.

A test that polls ``topo-tune admin nodes`` sees the change late by however long its polls take on a loaded
machine; the controller's decision does not depend on them. So scenarios time the gap between the node's
last heartbeat (``last_heartbeat_at``, as the controller recorded it) and the controller's ``node lost`` log
line (the controller must log JSON lines: ``--log-format json``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from tests.support.processes import Daemon
from tests.support.waiting import wait_until

SWEEP_LAG_S = 1.0
"""What the controller's expiry sweep may lag behind its schedule: its event loop shares a busy machine."""


def assert_lost_after_the_expiry(
    controller: Daemon, nodes: Callable[[], Mapping[str, Mapping[str, object]]], name: str, *, expiry_s: float
) -> None:
    """The node was declared lost once silent for ``expiry_s``: not before, and not later than the next expiry
    sweep (every quarter expiry) plus ``SWEEP_LAG_S``."""
    lost_at = wait_until(
        lambda: controller.logged_at("node lost", node=name), what=f"the controller's `node lost` line for {name}"
    )
    assert lost_at is not None
    last_heartbeat = datetime.fromisoformat(str(nodes()[name]["last_heartbeat_at"]))
    silent = (lost_at - last_heartbeat).total_seconds()
    # 50 ms under: the controller decides on its monotonic clock and records wall-clock times.
    assert expiry_s - 0.05 <= silent < expiry_s * 1.25 + SWEEP_LAG_S, (
        f"{name} declared lost {silent:.2f} s after its last heartbeat (expiry {expiry_s} s)"
    )
