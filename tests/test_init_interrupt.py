"""init's Ctrl-C: an interrupt init does not act on (Python swallows one raised in a finaliser) still ends it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from topo_tune.cli import init


@pytest.fixture(autouse=True)
def sigint_at_its_default() -> Iterator[None]:
    """As in a terminal's foreground job; a suite started in the background has SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupt_swallowed_on_the_way_still_ends_init_after_the_grace_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended = threading.Event()
    told: list[str] = []
    monkeypatch.setattr(init, "INTERRUPT_GRACE_S", 0.2)
    monkeypatch.setattr(init.os, "_exit", lambda status: (told.append(f"exit {status}"), ended.set()))
    with init._interruptible(lambda: told.append("how to resume")):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(1)  # the handler runs here
        except KeyboardInterrupt:
            pass  # swallowed, as in a finaliser
        assert ended.wait(10), "init went on after the interrupt"
    assert told == ["how to resume", "exit 130"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler is put back"


def test_a_second_interrupt_ends_init_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[str] = []
    monkeypatch.setattr(init.os, "_exit", lambda status: told.append(f"exit {status}"))
    with init._interruptible(lambda: told.append("how to resume")):
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(1)
        assert told == []
        os.kill(os.getpid(), signal.SIGINT)  # ends the process (os._exit), here recorded
        threading.Event().wait(1)
        assert told == ["how to resume", "exit 130"], "the second Ctrl-C, not the grace period (20 s)"
