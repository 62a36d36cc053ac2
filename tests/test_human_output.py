"""Every way the CLI prints for a person (a line, a laid-out block, a line on a rich console, a value quoted in a
line) keeps a peer's text inert: never parsed as markup, no control or bidirectional character reaching the
terminal raw, a line staying one line, bounded length."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tests.test_table_text import _RAW, HOSTILE
from topo_tune.cli.output import CELL_LIMIT, LINE_LIMIT, console_line, emit_line, emit_lines, shown

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=300) | st.sampled_from(HOSTILE)


def _printed(write: Callable[[], None]) -> tuple[str, str]:
    """What ``write`` printed on stdout and stderr (a context of its own per hypothesis example)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        write()
    return out.getvalue(), err.getvalue()


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_a_line_is_one_inert_line(text: str) -> None:
    out, err = _printed(lambda: (emit_line(f"topo-tune: error: {text}"), emit_line(text, err=True)))
    for printed in (out, err):
        assert printed.endswith("\n") and printed.count("\n") == 1, "a peer's newline never starts a line"
        assert not _RAW.search(printed)


@settings(max_examples=300, deadline=None)
@given(st.lists(TEXT, max_size=5))
def test_a_block_keeps_its_own_lines_and_escapes_the_rest(parts: list[str]) -> None:
    block = "\n".join(parts)
    _, err = _printed(lambda: emit_lines(block, err=True))
    assert not _RAW.search(err)
    assert err.count("\n") == block.count("\n") + 1, "only the block's own newlines start lines"
    # A peer's value put into a block with ``shown`` cannot add a line of its own.
    _, err = _printed(lambda: emit_lines("\n".join(f"# {shown(part)}" for part in parts), err=True))
    assert not _RAW.search(err)
    assert err.count("\n") == max(len(parts), 1)


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_a_console_line_is_plain_text(text: str) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=True, color_system="truecolor")
    console_line(console, text, style="bold")  # markup in the text would raise MarkupError or make a link
    written = buffer.getvalue()
    # The only escape sequences are the console's own styles (SGR): no OSC, no cursor movement, no raw control.
    without_styles = written.replace("\x1b[1m", "").replace("\x1b[0m", "")
    assert not _RAW.search(without_styles), repr(written)
    assert "\x1b]" not in written


@pytest.mark.parametrize("text", HOSTILE)
def test_markup_and_escapes_are_shown_as_the_characters_they_are(capsys: pytest.CaptureFixture[str], text: str) -> None:
    emit_line(text)
    out = capsys.readouterr().out
    assert out == shown(text) + "\n"
    if text.startswith("["):
        assert text in out
    assert "\\x1b" in out or "\x1b" not in text


def test_huge_values_are_bounded() -> None:
    assert len(shown("x" * 10_000_000)) < CELL_LIMIT + 64
    assert shown("x" * 10_000_000).endswith("(10000000 characters in all)")


def test_a_huge_line_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    emit_line("e" * 10_000_000, err=True)
    assert len(capsys.readouterr().err) < LINE_LIMIT + 64
