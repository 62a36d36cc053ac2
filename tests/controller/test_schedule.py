"""The periodic jobs' schedule: a run skipped behind a slow one is routine, counted, not warned of."""

from __future__ import annotations

import asyncio
import logging

import pytest

from topo_tune.controller.server import Controller


async def test_a_run_skipped_behind_a_slow_one_is_counted_and_not_warned_of(
    controller: Controller, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The expiry sweep runs every 0.25 s here; one run waits 1.2 s for the database (as in a registration
    # burst), so the runs due meanwhile are skipped: the next one after it does their work.
    swept = 0
    went_on = asyncio.Event()
    original = controller.jobs.sweep

    async def slow_sweep() -> list[str]:
        nonlocal swept
        swept += 1
        if swept == 1:
            await asyncio.sleep(1.2)
        if swept == 3:  # the slow run, then two more: the schedule went on
            went_on.set()
        return await original()

    monkeypatch.setattr(controller.jobs, "sweep", slow_sweep)
    caplog.set_level(logging.INFO)
    await asyncio.wait_for(went_on.wait(), 30)
    skipped = controller.metrics.registry.get_sample_value(
        "topo_tune_periodic_runs_skipped_total", {"job": "expiry-sweep"}
    )
    assert skipped is not None and skipped >= 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "maximum number" in r.getMessage()]
