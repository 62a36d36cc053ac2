"""Outside text in log lines: escaped, bounded, a few lines per node and interval, the rest counted."""

from __future__ import annotations

import json
import logging

from topo_tune.cli.logs import HumanFormatter, JsonFormatter
from topo_tune.security.log_text import LogGate, held_note, printable

FORGED = "ok\n12:00:00.000 INFO    topo_tune.controller.server: admin token accepted\x1b[2J\u2028\x85\t"


def test_printable_escapes_every_control_character_and_keeps_the_rest() -> None:
    assert printable(FORGED) == (
        "ok\\n12:00:00.000 INFO    topo_tune.controller.server: admin token accepted\\x1b[2J\\u2028\\x85\\t"
    )
    assert printable("ünïcode ✓ C:\\path") == "ünïcode ✓ C:\\path"


def test_printable_bounds_the_length_after_escaping() -> None:
    assert printable("x" * 10_000, limit=20) == "x" * 20 + "… (10000 characters in all)"
    cut = printable("\n" * 100, limit=20)
    assert cut.startswith("\\n" * 10) and cut.endswith("… (100 characters in all)")


def test_the_gate_lets_a_burst_through_then_counts_what_it_holds_back() -> None:
    now = [0.0]
    gate = LogGate(interval_s=60, burst=3, clock=lambda: now[0])
    assert [gate.admit("a", "event") for _ in range(5)] == [0, 0, 0, None, None]
    assert gate.admit("b", "event") == 0, "another node has its own allowance"
    assert gate.admit("a", "config_damage") == 0, "so has another kind of line"
    now[0] = 59.9
    assert gate.admit("a", "event") is None
    now[0] = 60.0
    assert gate.admit("a", "event") == 3, "the next line written says how many were held back"
    assert held_note(3) == " (3 more like it not logged)" and held_note(0) == ""


def test_the_gate_remembers_a_bounded_number_of_keys() -> None:
    gate = LogGate(burst=1, max_keys=10, clock=lambda: 0.0)
    for i in range(100):
        gate.admit(f"node-{i}", "event")
    assert len(gate._windows) == 10


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("topo_tune.controller.nodes", logging.ERROR, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    return record


def test_both_log_formats_write_one_line_whatever_the_caller_passed() -> None:
    record = _record(f"damaged: {FORGED}", node=f"n\n{FORGED}")
    human = HumanFormatter().format(record)
    assert "\n" not in human and "\x1b" not in human and "\u2028" not in human
    assert human.endswith("\\x1b[2J\\u2028\\x85\\t]")
    line = JsonFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "\u2028" not in line
    assert json.loads(line)["message"] == f"damaged: {FORGED}"  # escaped by construction, read back exactly
