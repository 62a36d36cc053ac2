"""Progress of a watched job, probe round or drift check, as ``#`` lines on stderr while the CLI waits."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from topo_tune.cli.output import emit_line

U = TypeVar("U")


def progress_lines(
    parts: str, running: Callable[[U], bool], counts: Callable[[U], tuple[int, int]]
) -> Callable[[U], None]:
    """An ``on_update`` that prints ``# 1/2 PARTS`` each time more parts are done (``counts``: done and total
    of an update), while ``running``."""
    shown = 0

    def show(update: U) -> None:
        nonlocal shown
        done, total = counts(update)
        if done > shown and running(update):
            emit_line(f"# {done}/{total} {parts}", err=True)
        shown = max(shown, done)

    return show
