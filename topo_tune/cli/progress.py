"""Progress of a watched job, probe round or drift check, as ``#`` lines on stderr while the CLI waits."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from topo_tune.cli.output import emit_line
from topo_tune.client.watch_step import WatchStep

T = TypeVar("T")


def progress_lines(parts: str, running: Callable[[T], bool]) -> Callable[[WatchStep[T]], None]:
    """An ``on_update`` that prints ``# 1/2 PARTS`` each time more parts are done, while ``running``."""
    shown = 0

    def show(step: WatchStep[T]) -> None:
        nonlocal shown
        if step.done > shown and running(step.value):
            emit_line(f"# {step.done}/{step.total} {parts}", err=True)
        shown = max(shown, step.done)

    return show
