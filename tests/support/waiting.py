"""Waiting on conditions with a deadline, instead of sleeping for a guessed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

STARTUP_TIMEOUT_S = 180.0
"""How long a daemon started by a test may take to serve: a bound for a broken run, not a measurement. On two
cores shared with other test workers, a Python process importing grpc, sqlalchemy and torch takes tens of
seconds to answer its first call."""


def wait_until(check: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.05, what: str = "") -> T:
    """Call ``check`` until it returns something truthy; return that. AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    last_value: object = None
    while True:
        try:
            value = check()
            if value:
                return value
            last_value = value
        except Exception as error:
            last_error = error
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what or check}: "
                f"last value {last_value!r}, last error {last_error!r}"
            )
        time.sleep(interval)


async def async_wait_until(
    check: Callable[[], Awaitable[T]], *, timeout: float = 20.0, interval: float = 0.02, what: str = ""
) -> T:
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except Exception as error:
            last_error = error
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}: last error {last_error!r}")
        await asyncio.sleep(interval)
