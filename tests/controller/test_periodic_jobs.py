"""Stopping the controller while a periodic job runs (a rollout reconcile pass, as when ``init`` closes) ends
that run quietly: no CancelledError traceback after the command's result."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.conftest import controller_settings
from topo_tune.controller.server import Controller


async def test_a_reconcile_pass_in_flight_at_stop_ends_without_a_traceback(
    sqlite_url: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    controller = Controller(controller_settings(sqlite_url, rollout_interval_s=0.05))
    entered = asyncio.Event()

    async def slow_pass() -> None:
        entered.set()
        await asyncio.Event().wait()  # a pass still waiting on the database when the controller stops

    controller.rollouts.reconcile = slow_pass  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG)
    await controller.start()
    await asyncio.wait_for(entered.wait(), 10)
    await controller.stop()
    await asyncio.sleep(0.1)  # APScheduler reports a finished run from a done-callback
    tracebacks = [r for r in caplog.records if r.exc_info or "CancelledError" in r.getMessage()]
    assert tracebacks == []
    assert "CancelledError" not in capsys.readouterr().err
    assert "periodic job rollout-reconcile cut short by shutdown" in caplog.messages
