"""A pre-imported parent for fresh benchmark workers: import torch once per launcher, fork each worker from there.

A fresh worker started as a new interpreter spends about 2 CPU-seconds importing torch before it does anything
(``benchmarks/results/worker-reuse.md``); kept workers (``kept_workers``) save that only for a job of the same
environment. The fork server is one process per launcher that imports the worker (and with it torch) once and
then forks each fresh worker on request, so a fresh worker starts in milliseconds. The child is the worker a
``python -c`` bootstrap would have been: it leaves the fork server's session for one of its own, dies with its
parent (``PR_SET_PDEATHSIG``; the fork server itself dies with the launcher's spawner thread), runs in the job's
directory with exactly the environment it was sent (``os.environ`` replaced, so ``getenv`` sees it), its stdin
the job pipe, stdout and stderr the job's file, and no other descriptor but the reply pipe; then it runs
:func:`topo_tune.agent.bench.worker.serve`.

What a fork cannot change is what the imports already read: nothing the environment policy lets a job set is
read at import (NCCL reads its variables at its first communicator, CUDA its device list at initialisation,
which the fork server never reaches: one whose imports initialised CUDA ends before it says ready, and workers
start as interpreters); the loader variables (``LD_*``, the agent's ``passthrough``) are the same for every
worker of an agent, and the fork server starts with them. On nccl a forked worker's CUDA, MPS client and NCCL are
its own, as a new interpreter's: on an H200, one rank and two ranks sharing the GPU (NCCL 2.30, MPS), every forked
job's data check passed and a fresh job took 0.9 s instead of 2.1-2.9 s (``benchmarks/results/worker-reuse.md``).

Protocol, on a ``SOCK_SEQPACKET`` pair: a request is one JSON message (``env``, ``cwd``, ``output``) carrying
two descriptors (the job pipe's read end, the reply pipe's write end); the answer is ``{"pid": N}`` once the child
is in its own session, or ``{"error": ...}``; ``{"exit": pid, "code": c}`` arrives when a child ended (the fork
server reaps its children; ``c`` as ``Popen.returncode`` has it, negative for a signal). The fork server's first
message is ``{"ready": true}`` after its imports. The launcher's side (:class:`ForkServer`) answers ``wait`` from
those messages; if the fork server dies, every child it had dies with it and is reported killed (SIGKILL).

Non-goals: which workers may be kept (``kept_workers``), deadlines and killing (``launcher``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO

from topo_tune.errors import ForkServerError

__all__ = ["ForkServer", "ForkServerError", "ForkedProcess"]

logger = logging.getLogger(__name__)

_MESSAGE_BYTES = 1 << 20
"""The largest request (a worker environment is a few kB)."""
_CHILD_READY_S = 30.0
_BOOTSTRAP = (
    # As the launcher's worker bootstrap: the parent-death signal first, then the agent's sys.path.
    "import ctypes, os, sys; ctypes.CDLL(None, use_errno=True).prctl(1, 9); "
    "os.getppid() == int(sys.argv[1]) or os._exit(70); "
    "import json; sys.path[:0] = json.loads(sys.argv[3]); "
    "from topo_tune.agent.bench.fork_server import serve_forks; serve_forks(int(sys.argv[2]), float(sys.argv[4]))"
)
IDLE_S = 300.0
"""A fork server with no worker alive for this long ends (it holds torch's few hundred MB); the next fresh worker
starts a new one. As long as a kept worker set may stay idle (``kept_workers.DEFAULT_IDLE_S``)."""


class ForkedProcess:
    """A worker forked by the fork server: what the launcher uses of a ``subprocess.Popen``."""

    def __init__(self, pid: int, stdin: BinaryIO, server: ForkServer, generation: int) -> None:
        self.pid = pid
        self.stdin: BinaryIO | None = stdin
        self._server = server
        self._generation = generation
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code if the process ended, else None (as ``Popen.poll``: a process that exited but whose exit
        the fork server has not reported yet counts as ended; its code is then waited for)."""
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, self._generation)
        if self.returncode is None and _exited(self.pid):
            return self.wait()
        return self.returncode

    def wait(self) -> int:
        """The exit code (negative: the signal), once the process ended."""
        if self.returncode is None:
            self.returncode = self._server.wait_for(self.pid, self._generation)
        return self.returncode


def _exited(pid: int) -> bool:
    """Process ``pid`` runs no more: gone, or a zombie not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


class ForkServer:
    """The launcher's side: start the fork server (lazily, from ``spawn``), fork workers, learn their exit codes.

    ``spawn`` runs a callable on the launcher's spawner thread (the parent-death signal follows the thread that
    started a process) and returns its result.
    """

    def __init__(
        self,
        *,
        python: str,
        spawn: Callable[[Callable[[], Any]], Any],
        ready_timeout_s: float = 180.0,
        idle_s: float = IDLE_S,
    ):
        self._python = python
        self._idle_s = idle_s
        self._spawn = spawn
        self._ready_timeout_s = ready_timeout_s
        self._lock = threading.Lock()  # one request at a time
        self._state = threading.Condition()
        self._exits: dict[tuple[int, int], int] = {}  # (generation, pid) -> exit code
        self._ended: set[int] = set()  # generations (fork server processes) that ended
        self._generation = 0
        self._answer: Future[dict[str, Any]] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._was_ready = False  # the fork server started last said ready

    @property
    def pid(self) -> int | None:
        """The fork server's process id (None before it started)."""
        return None if self._process is None else self._process.pid

    def start_worker(self, *, env: Mapping[str, str], cwd: Path, output: Path, log: Path) -> tuple[ForkedProcess, int]:
        """Fork a worker; returns it and the read end of its reply pipe. ``log``: the fork server's own output.

        A fork server that ended while idle (or just as the request reached it) is started again, once; one that
        never said ready is not (it would fail the same way)."""
        with self._lock:
            try:
                return self._start_worker(env=env, cwd=cwd, output=output, log=log)
            except ForkServerError:
                if not self._was_ready or not self._ended_now():
                    raise
                return self._start_worker(env=env, cwd=cwd, output=output, log=log)

    def _ended_now(self) -> bool:
        """Whether the fork server has ended, waiting a moment for its end to be seen."""
        process = self._process
        if process is None:
            return False
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return False  # alive: it refused the request
        with self._state:
            return self._state.wait_for(lambda: self._generation in self._ended, timeout=5)

    def _start_worker(self, *, env: Mapping[str, str], cwd: Path, output: Path, log: Path) -> tuple[ForkedProcess, int]:
        sock = self._ensure_started(env, cwd.parent, log)
        stdin_read, stdin_write = os.pipe()
        replies, reply_end = os.pipe()
        try:
            answer: Future[dict[str, Any]] = Future()
            with self._state:
                self._answer = answer
            request = json.dumps({"env": dict(env), "cwd": str(cwd), "output": str(output)}).encode()
            try:
                socket.send_fds(sock, [request], [stdin_read, reply_end])
                message = answer.result(timeout=_CHILD_READY_S)
            except (OSError, TimeoutError) as exc:
                raise ForkServerError(f"the fork server did not answer: {exc}") from exc
            if "pid" not in message:
                raise ForkServerError(f"the fork server refused a worker: {message.get('error', message)}")
        except BaseException:
            os.close(stdin_write)
            os.close(replies)
            raise
        finally:
            os.close(stdin_read)
            os.close(reply_end)
        return ForkedProcess(int(message["pid"]), os.fdopen(stdin_write, "wb"), self, self._generation), replies

    def exit_code(self, pid: int, generation: int) -> int | None:
        """The exit code of child ``pid`` of fork server ``generation`` if it ended, else None; never blocks."""
        with self._state:
            if (generation, pid) in self._exits:
                return self._exits.pop((generation, pid))
            return -signal.SIGKILL if generation in self._ended else None

    def wait_for(self, pid: int, generation: int) -> int:
        """The exit code of child ``pid`` of fork server ``generation``, once it ended."""
        with self._state:
            while (generation, pid) not in self._exits:
                if generation in self._ended:
                    return -signal.SIGKILL  # it died with its fork server (its parent-death signal)
                self._state.wait()
            return self._exits.pop((generation, pid))

    def close(self) -> None:
        """Kill the fork server (its idle children die with it); never waits long."""
        process = self._process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def _ensure_started(self, env: Mapping[str, str], cwd: Path, log: Path) -> socket.socket:
        if self._sock is not None and self._generation not in self._ended:
            return self._sock
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ready: Future[dict[str, Any]] = Future()
        try:
            sys_path = json.dumps([os.path.abspath(p) for p in sys.path if p])
            with log.open("ab") as output:
                command = [self._python, "-E", "-s", "-c", _BOOTSTRAP, str(os.getpid()), str(theirs.fileno()), sys_path]
                command.append(str(self._idle_s))
                process: subprocess.Popen[bytes] = self._spawn(
                    lambda: subprocess.Popen(
                        command,
                        env=dict(env),
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=output,
                        stderr=output,
                        start_new_session=True,
                        close_fds=True,
                        pass_fds=(theirs.fileno(),),
                    )
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        with self._state:
            self._generation += 1
            self._process, self._sock = process, ours
            self._answer = ready
            self._was_ready = False
        reader = threading.Thread(
            target=self._read, args=(ours, process, self._generation), name="fork-server-reader", daemon=True
        )
        reader.start()
        try:
            ready.result(timeout=self._ready_timeout_s)
        except (TimeoutError, OSError) as exc:
            self.close()
            raise ForkServerError(f"the fork server did not start: {exc}; its output: {log}") from exc
        self._was_ready = True
        logger.info("fork server started (pid %d)", process.pid)
        return ours

    def _read(self, sock: socket.socket, process: subprocess.Popen[bytes], generation: int) -> None:
        """Hand answers to the request waiting for one, and keep every child's exit code."""
        while True:
            try:
                data = sock.recv(_MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self._state:
                if "exit" in message:
                    self._exits[(generation, int(message["exit"]))] = int(message["code"])
                    self._state.notify_all()
                elif self._answer is not None:
                    self._answer.set_result(message)
                    self._answer = None
        sock.close()
        with self._state:
            self._ended.add(generation)
            if self._answer is not None and self._generation == generation:
                self._answer.set_exception(OSError("the fork server ended"))
                self._answer = None
            self._state.notify_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        logger.info("fork server %d ended", process.pid)


# The fork server's side, in its own process.


def serve_forks(sock_fd: int, idle_s: float = IDLE_S) -> None:
    """Import the worker, say ready, then fork one worker per request until the launcher's end closes, or until
    ``idle_s`` passed with no child alive."""
    # The point of this process: torch and the worker, imported once for every child (never in the agent).
    import torch  # noqa: PLC0415

    from topo_tune.agent.bench import worker  # noqa: F401, PLC0415

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # a forked child could not use CUDA
        print("fork server: the imports initialised CUDA; workers start as interpreters", file=sys.stderr)
        os._exit(1)
    sock = socket.socket(fileno=sock_fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sock.send(b'{"ready": true}')
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_read], [], [], None if children else idle_s)
        if wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
        children -= _reap(sock)
        if not readable and not children:
            os._exit(0)  # idle: the launcher starts a new one for its next fresh worker
        if sock.fileno() not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 2)
        if not data:
            os._exit(0)  # the launcher closed its end; the children die with this process
        try:
            request = json.loads(data)
            pid = _fork(request, fds, keep_closed=(sock.fileno(), wake_read, wake_write))
            children.add(pid)
            answer: dict[str, Any] = {"pid": pid}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(answer).encode())


def _reap(sock: socket.socket) -> set[int]:
    """Reap every child that ended, report each; their pids."""
    ended: set[int] = set()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.add(pid)
        sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _fork(request: dict[str, Any], fds: list[int], *, keep_closed: tuple[int, ...]) -> int:
    """Fork one worker; return its pid once it is in a session of its own (so killing its group reaches it)."""
    stdin_read, reply_end = fds
    in_session_read, in_session_write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        code = 1
        try:
            os.close(in_session_read)
            for fd in keep_closed:
                os.close(fd)
            _become_worker(request, stdin_read, reply_end, in_session_write, parent)
            from topo_tune.agent.bench.worker import serve  # noqa: PLC0415 - imported already, by serve_forks

            code = serve(reply_end)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)
    os.close(in_session_write)
    try:
        ready, _, _ = select.select([in_session_read], [], [], _CHILD_READY_S)
        if not ready or not os.read(in_session_read, 1):
            raise ChildProcessError("the forked worker died before its session was set up")
    finally:
        os.close(in_session_read)
    return pid


def _become_worker(request: dict[str, Any], stdin_read: int, reply_end: int, in_session: int, parent: int) -> None:
    """In the child: what ``Popen(start_new_session=True, cwd=..., env=..., close_fds=True)`` would have set up."""
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the fork server
    if os.getppid() != parent:
        os._exit(70)  # the fork server died before the signal was set
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.write(in_session, b"1")
    os.close(in_session)
    output = os.open(request["output"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(stdin_read, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    for fd in (stdin_read, output):
        if fd > 2 and fd != reply_end:
            os.close(fd)
    os.closerange(3, reply_end)
    os.closerange(reply_end + 1, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # TMPDIR is the job's now
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the worker reads it to the end)
