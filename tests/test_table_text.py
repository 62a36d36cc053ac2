"""Text a peer chose (an agent's version, address or labels, a command's result) is inert in every table: no rich
markup parsed, no control or bidirectional character reaching the terminal, no cell longer than the bound."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topo_tune.cli.output import CELL_LIMIT, emit_table

HOSTILE = [
    "[/x]",  # closes a tag never opened: rich raised MarkupError and the whole command died
    "[link=https://attacker.invalid]click[/link]",  # a live OSC 8 hyperlink
    "[bold red]fake error[/]",
    "\x1b[2J\x1b[Hscreen cleared",
    "\x1b]8;;https://attacker.invalid\x07link\x1b]8;;\x07",
    "\x1b]0;forged title\x07",
    "abc\u202edcba",  # right-to-left override
    "line\nforged second line",
    "nul\x00byte",
]
# What must never reach the terminal: ESC, BEL, other C0/C1 controls, the bidi and zero-width controls.
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _printed(capsys: pytest.CaptureFixture[str], cell: str) -> str:
    emit_table(f"nodes {cell}", ["NAME", f"VERSION {cell}"], [["gpu-1", cell], [cell, "ok"]])
    return capsys.readouterr().out


@pytest.mark.parametrize("cell", HOSTILE)
def test_a_hostile_cell_prints_as_its_plain_escaped_text(capsys: pytest.CaptureFixture[str], cell: str) -> None:
    out = _printed(capsys, cell)
    assert not _RAW.search(out), out
    assert "\x1b" not in out and "\u202e" not in out
    if cell.startswith("["):
        assert cell in out, "markup is shown as the characters it is, not applied"
    if "\n" in cell:
        assert "line\\nforged second line" in out, "a newline in a cell is shown as its escape, on one line"


def test_a_huge_cell_is_cut_and_says_how_long_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    out = _printed(capsys, "a" * 12_000_000)
    assert len(out) < 20 * CELL_LIMIT
    assert "(12000000 characters in all)" in out


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200) | st.sampled_from(HOSTILE))
def test_no_string_breaks_a_table_or_reaches_the_terminal_raw(cell: str) -> None:
    import io

    from rich.console import Console

    from topo_tune.cli import output

    buffer = io.StringIO()
    original = output.Console
    output.Console = lambda **kw: Console(file=buffer, width=kw.get("width", 400))  # type: ignore[assignment,misc]
    try:
        emit_table(cell, [cell], [[cell]])
    finally:
        output.Console = original  # type: ignore[misc]
    assert not _RAW.search(buffer.getvalue())
