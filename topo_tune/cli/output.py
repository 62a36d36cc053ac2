"""Printing results: tables for people, JSON or YAML for scripts.

``-o json`` and ``-o yaml`` are the stable scripting interface: every admin command and ``topology show``
print the wire messages' plain form (``wire/plain_data.py``: as kubectl does, enum values as words, integers as
numbers, timestamps in RFC 3339), which the admin client hands over with each answer.

Everything for people goes through this module, because it holds text that peers chose (an agent's version,
address, labels, a command's result, a controller's answer or error, a stored value, a trace file): tables
(``emit_table``), lines (``emit_line``: one line, a newline in it shown as ``\\n``), blocks the CLI laid out
(``emit_lines``), lines on a rich console (``console_line``) and values put into such lines (``shown``). Text is
never parsed as rich markup (``[/x]`` would crash the command, ``[link=…]`` would make a live hyperlink), and
control and bidirectional characters (``ESC[2J``, OSC 8 links, OSC 0 titles, U+202E, NUL) are shown as their
escapes, as the logs show them (``security/log_text.py``); a table cell or ``shown`` value is at most
``CELL_LIMIT`` characters.

Non-goals: the plain form itself (``wire/plain_data.py``), and the ``table`` format (which stays made for people).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import click
import yaml
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
