"""A command ``exec`` runs as its child rather than in its place, and ending as that child ended.

``exec`` replaces itself with the job's command when it can. It runs the command as a child when it has work
left once the command ends: removing a launcher's hostfile (srun, mpirun), or shipping a learning job's timing
records. Signals a scheduler sends to ``exec`` alone are passed on; a terminal's reach the child directly.
Non-goals: what the command is (``jobs.launchers``) and what is done after it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import NoReturn

import click

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""What a scheduler or supervisor sends to ``exec`` alone; passed on to the launcher."""
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT)
"""A terminal's Ctrl-C and Ctrl-\\ reach the launcher itself (one process group), as under a shell: ``exec``
ignores them while it waits. Passed on as well, srun would read one Ctrl-C as two (two within a second
cancel the job)."""


def run_child(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` as a child, passing signals on, and return its status (``-N``: killed by signal N)."""
    try:
        process = subprocess.Popen(argv, env=env, close_fds=False)  # jobs.lock stays with the command
    except OSError as error:
        raise click.ClickException(f"cannot run {argv[0]!r}: {error.strerror}") from None
    previous = {
        sig: signal.signal(sig, lambda number, _frame: process.send_signal(number)) for sig in FORWARDED_SIGNALS
    }
    previous.update({sig: signal.signal(sig, signal.SIG_IGN) for sig in TERMINAL_SIGNALS})
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def end_as(status: int) -> NoReturn:
    """End as a child with ``status`` ended: its exit status, or killed by the same signal."""
    if status < 0:
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught, nor need resetting
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)
