"""``init``'s progress as a person reads it: a line per phase (nodes, probe, search, proof, outputs).

On a terminal each phase is a live rich bar with its count, the best speedup so far, the time spent and an
estimate of the time left; once the next phase starts it stays on screen as that phase's line. Written to a
file or a pipe there is no bar: each phase's first line, and any note, once, then a count line at most every
``PLAIN_EVERY_S`` while a phase runs (``proving …: 40/120, 3m10s, ETA 4m``), so that a log read with
``kubectl logs`` or in CI shows a long proof moving.

Non-goals: logging (``logs``: INFO lines go to the output's log file); progress of ``admin`` commands that
wait on a controller (``progress``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from topo_tune.cli.output import console_line
from topo_tune.security.log_text import escaped
from topo_tune.tuner.study import StudyProgress

_PHASE_OF_STATUS = {"waiting for nodes": "nodes", "probing": "probe", "searching": "search", "writing": "outputs"}
"""A status line's first words → its phase; any other status is a note printed once above the bars."""

PLAIN_EVERY_S = 60.0
"""Without a terminal: the longest a running phase goes without a line."""

_STUDY_PHASES = {"search": "searching", "proof": "proving the finalists against NCCL's defaults (A/B pairs)"}


def phase_of(text: str) -> str | None:
    """The phase a status line of the tuning pass belongs to, None for a note."""
    return next((phase for prefix, phase in _PHASE_OF_STATUS.items() if text.startswith(prefix)), None)


def eta_text(update: StudyProgress, *, phase_started: float, now: float) -> str:
    """``ETA 42s``: the study's own estimate (it knows the per-trial time), else this phase's rate so far."""
    if update.eta_s is not None:
        return f"ETA {update.eta_s:.0f}s"
    if update.total and 0 < update.done < update.total:
        left = (now - phase_started) / update.done * (update.total - update.done)
        return f"ETA {left:.0f}s"
    return ""


class PhaseDisplay:
    """``status`` and ``study`` are the tuning pass's ``on_status`` and ``on_progress``."""

    def __init__(self, console: Console, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._console = console
        self._clock = clock
        self._live = console.is_terminal
        self._progress = Progress(
            # Plain text: a status line quotes node names and a controller's words, never markup.
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}", markup=False),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}", markup=False),
            console=console,
            transient=False,
            disable=not self._live,
        )
        self._phase: str | None = None
        self._task: TaskID | None = None
        self._started = 0.0
        self._said: set[str] = set()
        self._counted = 0.0  # when the last count line was printed (no terminal)

    def __enter__(self) -> PhaseDisplay:
        self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is None and self._task is not None and self._progress.tasks[-1].total is None:
            self._progress.update(self._task, total=1, completed=1)  # the last phase's line ends as done
        self._progress.stop()

    def _begin(self, phase: str, description: str) -> None:
        if self._task is not None:
            self._progress.stop_task(self._task)
        self._phase, self._started = phase, self._clock()
        self._counted = self._started
        self._task = self._progress.add_task(escaped(description), total=None, best="", eta="")
        self._say(description)

    def _say(self, text: str) -> None:
        if not self._live and text not in self._said:  # no bar in a log: each line once
            console_line(self._console, text)
            self._said.add(text)

    def status(self, text: str) -> None:
        phase = phase_of(text)
        if phase is None:
            if self._live:
                console_line(self._progress.console, text)
            else:
                self._say(text)
        elif phase != self._phase:
            self._begin(phase, text)
        elif self._task is not None:
            self._progress.update(self._task, description=escaped(text))
            if phase == "nodes":  # the count of ready nodes, as it changes
                self._say(text)

    def study(self, update: StudyProgress) -> None:
        if update.phase == "done":
            if self._task is not None:
                self._progress.update(self._task, completed=update.done, total=update.total)
            return
        if update.phase != self._phase:
            self._begin(update.phase, f"{_STUDY_PHASES.get(update.phase, update.phase)}")
        assert self._task is not None
        best = f"search best {update.best_value:.3f}x" if update.best_value is not None else ""
        eta = eta_text(update, phase_started=self._started, now=self._clock())
        self._progress.update(self._task, completed=update.done, total=update.total, best=best, eta=eta)
        now = self._clock()
        if not self._live and now - self._counted >= PLAIN_EVERY_S:
            self._counted = now
            spent = f"{(now - self._started) // 60:.0f}m{(now - self._started) % 60:02.0f}s"
            parts = [f"{update.done}/{update.total}", best, spent, eta]
            line = f"{_STUDY_PHASES.get(update.phase, update.phase)}: {', '.join(p for p in parts if p)}"
            console_line(self._console, line)
