"""Progress of a watched job, probe round or drift check, as ``#`` lines on stderr while the CLI waits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from topo_tune.cli.output import emit_line
from topo_tune.v1 import admin_pb2


class _Update(Protocol):
    @property
    def progress(self) -> admin_pb2.Progress: ...


U = TypeVar("U", bound=_Update)


def progress_lines(parts: str, running: Callable[[U], bool]) -> Callable[[U], None]:
    """An ``on_update`` that prints ``# 1/2 PARTS`` each time more parts are done, while ``running``."""
    shown = 0

    def show(update: U) -> None:
        nonlocal shown
        done, total = update.progress.done, update.progress.total
        if done > shown and running(update):
            emit_line(f"# {done}/{total} {parts}", err=True)
        shown = max(shown, done)

    return show
