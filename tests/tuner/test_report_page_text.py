"""The report shows a peer's text inert: HTML-escaped, and control and bidirectional characters as escapes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from topo_tune.tuner.report.markup import data_table, page_text

HOSTILE = "ok\u202eexe.txt\x1b[2J<script>alert(1)</script>\u200b\x00"


def test_a_hostile_reason_is_escaped_for_the_page() -> None:
    shown = page_text(HOSTILE)
    assert shown == "ok\\u202eexe.txt\\x1b[2J&lt;script&gt;alert(1)&lt;/script&gt;\\u200b\\x00"


def test_a_layout_keeps_its_newlines_and_tabs() -> None:
    assert page_text("a\tb\nc\r") == "a\tb\nc\\r"


def test_a_table_cell_from_a_peer_is_inert() -> None:
    table = data_table(["node", "reason"], [["n1", HOSTILE]])
    assert "\u202e" not in table and "\x1b" not in table and "<script>" not in table
    assert "ok\\u202eexe.txt" in table


@given(st.text())
def test_no_control_or_bidi_character_reaches_the_page(value: str) -> None:
    shown = page_text(value)
    assert not any(
        (ord(c) < 0x20 and c not in "\n\t")
        or 0x7F <= ord(c) <= 0x9F
        or 0x200B <= ord(c) <= 0x200F
        or 0x2028 <= ord(c) <= 0x202E
        or 0x2060 <= ord(c) <= 0x2069
        or c == "\ufeff"
        for c in shown
    )
    assert "<" not in shown and ">" not in shown
