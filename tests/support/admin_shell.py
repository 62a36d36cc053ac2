"""One long-lived ``topo-tune`` process that runs many ``topo-tune admin`` commands, one after another.

Scenarios poll the controller through the CLI many times a second while they wait; a fresh Python process per
call costs a few tenths of a second of CPU (interpreter, gRPC and protobuf start-up) that the daemons under
test then lack on a 2-core machine. This process starts once, in the namespace of the caller's choosing, and
runs each command through the same click entry point ``python -m topo_tune`` uses (``standalone_mode``,
exit codes, stdout and stderr kept apart), with its own gRPC channel per command as a fresh process would.

Protocol: a JSON list of arguments per line on stdin; per command one JSON object on the original stdout:
``{"code": int, "stdout": str, "stderr": str}``. Anything else the process writes to its stdout goes to its
stderr instead, so it cannot corrupt a reply.

Non-goals: concurrent commands (callers serialise them) and commands that read stdin.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner

from topo_tune.cli.main import cli


def serve() -> None:
    """Run commands read from stdin until it closes."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray writes to fd 1 (gRPC's C core, a forgotten print) land in the log, not in a reply
    runner = CliRunner()
    for line in sys.stdin:
        args = json.loads(line)
        result = runner.invoke(cli, args, prog_name="topo-tune", env=None, catch_exceptions=True)
        stderr = result.stderr
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            # A bug, not a CLI error: a fresh process would have printed its traceback.
            assert result.exc_info is not None
            stderr += "".join(traceback.format_exception(*result.exc_info))
        replies.write(json.dumps({"code": result.exit_code, "stdout": result.stdout, "stderr": stderr}) + "\n")
        replies.flush()


@dataclass
class AdminShell:
    """The caller's end: start the process lazily, send it commands, restart it after a timeout."""

    argv_prefix: Sequence[str]
    """Put before ``python -m tests.support.admin_shell``, e.g. ``ip netns exec NS``."""
    env: dict[str, str]
    log: Path
    """Where the process's own stderr goes (a command's stderr comes back in its reply)."""
    _process: subprocess.Popen[str] | None = None
    _replies: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, args: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """``topo-tune ARGS`` as ``subprocess.run`` would report it; ``TimeoutExpired`` after ``timeout``."""
        argv = ["topo-tune", *args]
        with self._lock:
            process = self._started()
            assert process.stdin is not None
            try:
                process.stdin.write(json.dumps(list(args)) + "\n")
                process.stdin.flush()
                line = self._replies.get(timeout=timeout)
            except queue.Empty:
                self.close()  # it may be stuck in that command: the next one gets a fresh process
                raise subprocess.TimeoutExpired(argv, timeout) from None
            except BrokenPipeError:
                line = None
            if line is None:
                code = self.close()
                raise RuntimeError(f"the admin shell exited {code} while running {argv}")
        reply = json.loads(line)
        return subprocess.CompletedProcess(argv, int(reply["code"]), str(reply["stdout"]), str(reply["stderr"]))

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._replies = queue.Queue()
            with self.log.open("ab") as log:
                self._process = subprocess.Popen(
                    [*self.argv_prefix, sys.executable, "-m", "tests.support.admin_shell"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=self.env,
                )
            threading.Thread(target=self._read, args=(self._process, self._replies), daemon=True).start()
        return self._process

    @staticmethod
    def _read(process: subprocess.Popen[str], replies: queue.Queue[str | None]) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                replies.put(line)
        replies.put(None)  # it exited

    def close(self) -> int | None:
        """Stop the process (SIGKILL: it holds nothing worth a clean exit); its exit status."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        code = process.wait(10)
        if process.stdin is not None:
            with contextlib.suppress(OSError):  # stdout is the reader thread's: it closes it at the end
                process.stdin.close()
        return code


if __name__ == "__main__":
    serve()
