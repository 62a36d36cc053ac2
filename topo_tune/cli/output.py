"""Printing results: tables for people, JSON or YAML for scripts.

``-o json`` and ``-o yaml`` are the stable scripting interface: every admin command and ``topology show``
print their wire messages through :func:`to_data`, which gives plain values, as kubectl does —

* enum values as lower-case words without their type's prefix (``NODE_STATE_READY`` → ``ready``,
  ``NIC_LINK_LAYER_INFINIBAND`` → ``infiniband``; an unset enum is ``unspecified``);
* every integer as a number, 64-bit ones included (protobuf's own JSON prints those as strings);
* timestamps in RFC 3339 (UTC, ``Z``); an unset one is ``null``;
* every field of a message, under its proto field name; an unset ``optional`` field or message is ``null``;
  of a ``oneof``, only the member that is set;
* a float that is not finite as the string ``NaN``, ``Infinity`` or ``-Infinity`` (JSON has no such number).

Everything for people goes through this module, because it holds text that peers chose (an agent's version,
address, labels, a command's result, a controller's answer or error, a stored value, a trace file): tables
(``emit_table``), lines (``emit_line``: one line, a newline in it shown as ``\\n``), blocks the CLI laid out
(``emit_lines``), lines on a rich console (``console_line``) and values put into such lines (``shown``). Text is
never parsed as rich markup (``[/x]`` would crash the command, ``[link=…]`` would make a live hyperlink), and
control and bidirectional characters (``ESC[2J``, OSC 8 links, OSC 0 titles, U+202E, NUL) are shown as their
escapes, as the logs show them (``security/log_text.py``); a table cell or ``shown`` value is at most
``CELL_LIMIT`` characters.

Non-goals: reading data back into messages, and the ``table`` format (which stays made for people).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from typing import Any

import click
import yaml
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console
from rich.table import Table
from rich.text import Text

from topo_tune.security.log_text import escaped, escaped_keeping_layout, printable

FORMATS = ("table", "json", "yaml")
CELL_LIMIT = 512
"""The most characters a table cell shows of one value (after escaping); longer ones say how long they were."""
LINE_LIMIT = 16_384
"""The most characters ``emit_line`` prints of one line (after escaping): an error quoting a huge value stays one
screenful."""


def to_data(message: Message) -> dict[str, Any]:
    """``message`` as plain JSON/YAML-ready data (see the module docstring for the conventions)."""
    data: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        synthetic = oneof is not None and oneof.name == f"_{field.name}"  # proto3 ``optional``
        if oneof is not None and not synthetic and message.WhichOneof(oneof.name) != field.name:
            continue
        entry = field.message_type if field.type == FieldDescriptor.TYPE_MESSAGE else None
        if entry is not None and field.is_repeated and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            data[field.name] = {
                str(key): _plain(value, value_field.enum_type)
                for key, value in sorted(getattr(message, field.name).items(), key=lambda item: str(item[0]))
            }
        elif field.is_repeated:
            data[field.name] = [_plain(value, field.enum_type) for value in getattr(message, field.name)]
        elif field.has_presence and not message.HasField(field.name):
            data[field.name] = None
        else:
            data[field.name] = _plain(getattr(message, field.name), field.enum_type)
    return data


def enum_word(enum: EnumDescriptor, number: int) -> str:
    """The plain word for an enum value: its name less the type's UPPER_SNAKE prefix, lower-cased."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    return value.name.removeprefix(_prefix(enum)).lower()


def _plain(value: Any, enum: Any) -> Any:
    """``value`` of a field whose enum type is ``enum`` (None: not an enum), as plain data."""
    if isinstance(value, Timestamp):
        return value.ToJsonString() if (value.seconds or value.nanos) else None
    if isinstance(value, Duration):
        return value.ToTimedelta().total_seconds()
    if isinstance(value, Message):
        return to_data(value)
    if enum is not None:
        return enum_word(enum, value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _prefix(enum: EnumDescriptor) -> str:
    """The prefix every value of ``enum`` shares, up to an underscore (``NODE_STATE_`` of NodeState)."""
    words = [v.name.split("_") for v in enum.values]
    shared = 0
    while len(words) > 1 and all(len(w) > shared + 1 and w[shared] == words[0][shared] for w in words):
        shared += 1
    return "".join(f"{word}_" for word in words[0][:shared])


def emit_data(data: object, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def shown(value: object) -> str:
    """``value`` (a peer's) as a line may quote it: control and bidirectional characters escaped, bounded."""
    return printable(str(value), limit=CELL_LIMIT)


def inert(value: object) -> Text:
    """``value`` as a table shows it: plain text (no markup), control characters escaped, bounded."""
    return Text(shown(value))


def emit_line(text: str, *, err: bool = False) -> None:
    """``text`` as one line for a person (stdout, or stderr with ``err``): every control character, a newline
    too, shown as its escape, so that a peer's text can neither forge a line nor drive the terminal."""
    click.echo(printable(text, limit=LINE_LIMIT), err=err)


def emit_lines(text: str, *, err: bool = False, nl: bool = True) -> None:
    """Lines the CLI laid out (a rendered matrix, a plan, a file's text): each line's control and bidirectional
    characters shown as escapes, the newlines and tabs that lay it out kept."""
    click.echo(escaped_keeping_layout(text), err=err, nl=nl)


def console_line(console: Console, text: str, *, style: str = "") -> None:
    """``text`` on a rich console (``init``'s progress) as plain text: never markup, control characters escaped."""
    console.print(Text(escaped(text), style=style), highlight=False, soft_wrap=True)


def emit_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=inert(title), title_justify="left", box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(inert(column))
    for row in rows:
        table.add_row(*(inert(cell) for cell in row))
    console = Console()
    if not console.is_terminal:
        # Piped output: never truncate ids to fit an imagined 80-column screen.
        console = Console(width=400)
    console.print(table)
