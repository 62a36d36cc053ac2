"""Logging set-up, done only here: human-readable lines or JSON lines, with node/command/... ids.

A daemon logs to stderr at ``--log-level``. ``init`` is a command a person watches: its INFO lines go to a
file under its output directory and the terminal gets WARNING and up, unless ``-v`` or ``--log-level``
asks for them there (``log_to_file``). The libraries' own chatter (Optuna, gRPC, APScheduler) is kept to
WARNING and up and passes through these handlers only (``quiet_libraries``).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

from topo_tune.security.log_text import escaped

# Attributes every LogRecord has; anything else was passed with ``extra=`` and is an id worth showing.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class HumanFormatter(logging.Formatter):
    """One line a record (a traceback below it aside): control characters in the message and ids are escaped,
    so no text from an agent or a job, however a caller passed it, can start a line of its own."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S.%f")[:-3]
        ids = escaped(" ".join(f"{k}={v}" for k, v in _extras(record).items()))
        line = f"{when} {record.levelname:<7} {record.name}: {escaped(record.getMessage())}" + (
            f" [{ids}]" if ids else ""
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line; ``json.dumps`` escapes every control character (``\\n``, ``\\u001b``) itself."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


LEVEL_CHOSEN = "topo_tune.log_level_chosen"
"""``click.Context.meta`` key: whether ``-v``/``--log-level``/``$TOPO_TUNE_LOG_LEVEL`` chose stderr's level."""

_LIBRARIES = ("apscheduler", "optuna", "grpc")
"""Their INFO lines (every job run of a one-second sweep, every study created) are noise here."""


def configure(*, level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else HumanFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


def quiet_libraries() -> None:
    """Optuna's records through the root handlers, not its own stderr handler (once Optuna is imported)."""
    import optuna  # noqa: PLC0415 - only the commands that run studies load it

    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()
    optuna.logging.set_verbosity(max(logging.WARNING, logging.getLogger().level))
    logging.captureWarnings(True)  # its ExperimentalWarning and the like: records, not bare lines on stderr


def log_to_file(path: Path, *, terminal_too: bool) -> Path:
    """Every record also goes to ``path`` (appended); the terminal keeps only WARNING and up unless ``terminal_too``."""
    root = logging.getLogger()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(HumanFormatter())
    if not terminal_too:
        for existing in root.handlers:
            existing.setLevel(max(logging.WARNING, root.level))
    root.addHandler(handler)
    return path
