"""Printing results: tables for people, JSON or YAML for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click
import yaml
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "json", "yaml")


def to_data(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def emit_data(data: object, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def emit_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        # Piped output: never truncate ids to fit an imagined 80-column screen.
        console = Console(width=400)
    console.print(table)
