"""Reading a large JSON document value by value, with bounds on the whole text and on each value.

A PyTorch profiler trace is one JSON object whose ``traceEvents`` array can hold millions of small events,
and an NCCL Inspector log is a sequence of JSON objects, one per collective. Loading either whole costs
about ten times its text in memory; here only the value being decoded is held (``json.JSONDecoder.
raw_decode`` over a sliding buffer), so memory stays bounded by ``max_value_chars`` whatever the file's size.
Every failure is a :class:`~topo_tune.errors.WorkloadFileError` naming the file: truncated, malformed, too
large, or a value too long.

Non-goals: a general streaming JSON API (only what the readers of this package need), and writing JSON.
"""

from __future__ import annotations

import gzip
import json
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from topo_tune.errors import WorkloadFileError

__all__ = ["DEFAULT_LIMITS", "JsonStream", "Limits", "open_text"]

_CHUNK = 1 << 16
_WHITESPACE = " \t\r\n"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one file: its (decompressed) text and any single value in it."""

    max_chars: int = 8 << 30
    """Largest text read (after gzip); a longer file is refused rather than read for hours."""
    max_value_chars: int = 16 << 20
    """Longest single value (one trace event, one Inspector record): the memory one value may take."""


DEFAULT_LIMITS = Limits()


@contextmanager
def open_text(path: Path) -> Iterator[TextIO]:
    """``path`` as UTF-8 text, gunzipped when it starts with gzip's magic bytes; errors name the file."""
    try:
        with path.open("rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rt", encoding="utf-8") if gzipped else path.open(encoding="utf-8") as text:
            yield text
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise WorkloadFileError(str(path), f"not a complete gzip file ({error})") from None
    except UnicodeDecodeError as error:
        raise WorkloadFileError(str(path), f"not UTF-8 text at byte {error.start}") from None
    except OSError as error:
        raise WorkloadFileError(str(path), error.strerror or str(error)) from None


class _NotJson(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python's json reads them, JSON has no such values."""


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value (durations and sizes must be finite numbers)")


class JsonStream:
    """JSON values read one at a time from a text stream (see the module docstring)."""

    def __init__(self, text: TextIO, *, source: str, limits: Limits) -> None:
        self._text = text
        self._source = source
        self._limits = limits
        self._buffer = ""
        self._pos = 0
        self._read = 0
        self._eof = False
        self._decoder = json.JSONDecoder(parse_constant=_refuse_constant)

    def error(self, reason: str) -> WorkloadFileError:
        return WorkloadFileError(self._source, reason)

    # ---------------------------------------------------------------- characters

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self._text.read(_CHUNK)
        if not chunk:
            self._eof = True
            return False
        self._read += len(chunk)
        if self._read > self._limits.max_chars:
            raise self.error(f"larger than {self._limits.max_chars} characters of JSON; refusing to read it all")
        if self._pos > _CHUNK:
            self._buffer = self._buffer[self._pos :]
            self._pos = 0
        self._buffer += chunk
        return True

    def peek(self) -> str:
        """The next character that is not white space, not consumed ('' at the end)."""
        while True:
            while self._pos < len(self._buffer) and self._buffer[self._pos] in _WHITESPACE:
                self._pos += 1
            if self._pos < len(self._buffer):
                return self._buffer[self._pos]
            if not self._fill():
                return ""

    def expect(self, char: str, *, what: str) -> None:
        got = self.peek()
        if got != char:
            raise self.error(self._unexpected(got, f"{char!r} {what}"))
        self._pos += 1

    def at_end(self) -> bool:
        return self.peek() == ""

    def _at(self, pos: int) -> int:
        """The character number in the file of ``pos`` in the buffer."""
        return self._read - len(self._buffer) + pos

    def _unexpected(self, got: str, wanted: str) -> str:
        if got == "":
            return f"truncated: the JSON ends where {wanted} should follow"
        return f"malformed JSON at character {self._at(self._pos)}: expected {wanted}, got {got!r}"

    # ---------------------------------------------------------------- values

    def value(self) -> Any:
        """The next complete value, consumed."""
        if self.peek() == "":
            raise self.error("truncated: the JSON ends where a value should follow")
        while True:
            start = self._pos
            try:
                value, end = self._decoder.raw_decode(self._buffer, start)
            except RecursionError:
                # The C scanner recurses per level and stops at Python's recursion limit, long before memory.
                raise self.error(f"malformed JSON at character {self._at(start)}: nested too deeply") from None
            except _NotJson as error:
                raise self.error(f"malformed JSON at character {self._at(start)}: {error}") from None
            except json.JSONDecodeError as error:
                if len(self._buffer) - start > self._limits.max_value_chars:
                    raise self.error(
                        f"a single value is longer than {self._limits.max_value_chars} characters"
                    ) from None
                if self._fill():
                    continue
                at = self._at(error.pos)
                if error.pos >= len(self._buffer) - 1 or error.msg.startswith("Unterminated"):
                    raise self.error(f"truncated: the JSON ends inside a value (character {at})") from None
                raise self.error(f"malformed JSON at character {at}: {error.msg}") from None
            except ValueError as error:
                # int() refuses more than sys.get_int_max_str_digits() digits (4300): a number no field holds.
                if "digits" not in str(error):
                    raise
                raise self.error(
                    f"malformed JSON at character {self._at(start)}: an integer of more than "
                    f"{sys.get_int_max_str_digits()} digits"
                ) from None
            if end == len(self._buffer) and self._fill():
                continue  # a number may go on in the next chunk
            if end - start > self._limits.max_value_chars:
                raise self.error(f"a single value is longer than {self._limits.max_value_chars} characters")
            self._pos = end
            return value

    def array_items(self, *, name: str) -> Iterator[Any]:
        """The items of the array ``name`` that starts here, each decoded on its own; errors name the item."""
        got = self.peek()
        if got != "[":
            raise self.error(self._unexpected(got, f"'[' to open the array {name}"))
        self._pos += 1
        if self.peek() == "]":
            self._pos += 1
            return
        index = 0
        while True:
            try:
                item = self.value()
            except WorkloadFileError as error:
                raise self.error(f"{name}[{index}]: {error.reason}") from None
            yield item
            got = self.peek()
            if got == "]":
                self._pos += 1
                return
            if got != ",":
                raise self.error(f"after {name}[{index}]: " + self._unexpected(got, "',' or ']' in an array"))
            self._pos += 1
            index += 1

    def object_keys(self) -> Iterator[str]:
        """The keys of the object that starts here; after each, the caller consumes its value."""
        self.expect("{", what="to open an object")
        if self.peek() == "}":
            self._pos += 1
            return
        while True:
            key = self.value()
            if not isinstance(key, str):
                raise self.error(f"malformed JSON: an object key must be a string, got {key!r}")
            self.expect(":", what="after an object key")
            yield key
            got = self.peek()
            if got == "}":
                self._pos += 1
                return
            if got != ",":
                raise self.error(self._unexpected(got, "',' or '}' in an object"))
            self._pos += 1
