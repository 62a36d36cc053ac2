"""Logging set-up, done only here: human-readable lines or JSON lines, with node/command/... ids."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from topo_tune.log_text import escaped

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


def configure(*, level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else HumanFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # APScheduler logs every job run at INFO; that is noise at a one-second sweep.
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))
