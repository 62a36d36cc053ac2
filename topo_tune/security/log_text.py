"""Text from elsewhere (an agent's report, a job's result) made safe to put in a log line, and how often.

Anyone holding an agent credential chooses the text of a heartbeat's ``config_damage`` or an event's
``message``. Logged raw, a newline followed by a well-formed prefix forges a whole line of the controller's
log (``… INFO topo_tune.controller.server: admin token accepted``) and ANSI escapes rewrite the operator's
terminal. ``printable`` shows every control character as its escape (``\\n``, ``\\x1b``, ``\\u2028``) and
bounds the length; ``LogGate`` lets a node's lines of one kind through a few per interval and counts the
ones it held back, so that a chattering (or hostile) agent cannot fill the log.

Non-goals: judging whether the text is true, and escaping for a particular output (the JSON log format
escapes by construction; the human one escapes again, whatever the caller passed).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_LOGGED = 512
"""The most characters of one outside text a log line shows (after escaping)."""

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, zero-width and bidirectional controls
# (which reorder what a terminal shows) and the byte-order mark.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escaped(text: str) -> str:
    """``text`` with every control character shown as its escape; nothing cut."""
    return _UNSAFE.sub(_escape, text)


def escaped_keeping_layout(text: str) -> str:
    """``text`` with every control character shown as its escape but the newlines and tabs that lay it out
    (a block of lines for a terminal, a report's preformatted text)."""
    return "\n".join("\t".join(escaped(part) for part in line.split("\t")) for line in text.split("\n"))


def printable(text: str, *, limit: int = MAX_LOGGED) -> str:
    """``text`` as one log line may show it: control characters escaped, at most ``limit`` characters."""
    shown = escaped(text[:limit])
    if len(shown) <= limit and len(text) <= limit:
        return shown
    return f"{shown[:limit]}… ({len(text)} characters in all)"


@dataclass
class LogGate:
    """At most ``burst`` lines per ``interval_s`` for each key (a node and what is logged about it).

    ``admit`` says whether a line may be written now and, when it may, how many of its key's lines were held
    back since the last one written, so that the line can say so. Keys are the caller's (a node name and a
    fixed kind, never the agent's text, which would let an agent mint a key per line); at most ``max_keys``
    are remembered, the oldest forgotten first.
    """

    interval_s: float = 60.0
    burst: int = 5
    clock: Callable[[], float] = time.monotonic
    max_keys: int = 10_000
    _windows: dict[tuple[str, str], _Window] = field(default_factory=dict, init=False)

    def admit(self, node: str, kind: str) -> int | None:
        """None: do not log this one. Else the number of this key's lines held back before it."""
        now = self.clock()
        key = (node, kind)
        window = self._windows.get(key)
        if window is None or now - window.started >= self.interval_s:
            held = window.held if window is not None else 0
            self._windows.pop(key, None)
            if len(self._windows) >= self.max_keys:
                del self._windows[next(iter(self._windows))]
            self._windows[key] = _Window(started=now, written=1)
            return held
        if window.written < self.burst:
            window.written += 1
            return 0
        window.held += 1
        return None


@dataclass
class _Window:
    started: float
    written: int
    held: int = 0


def held_note(held: int) -> str:
    """What a line admitted by ``LogGate`` adds when lines before it were held back."""
    return f" ({held} more like it not logged)" if held else ""
