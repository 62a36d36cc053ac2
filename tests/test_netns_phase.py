"""``make test``'s last phase collects only ``tests/netns`` (``pytest tests/netns -m netns``): collecting every
test module for a marker takes seconds of CPU. The first phase leaves netns tests out, so a test marked netns
anywhere else would run in neither phase; this keeps them all under ``tests/netns``."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
NETNS = TESTS / "netns"
MARKER = "mark." + "netns"  # spelled in two parts, so that this file does not name it


def test_every_test_marked_netns_lives_under_tests_netns() -> None:
    marked = [path for path in sorted(TESTS.rglob("*.py")) if MARKER in path.read_text(encoding="utf-8")]
    assert marked, "the netns tests were found"
    outside = [str(path.relative_to(TESTS)) for path in marked if NETNS not in path.parents]
    assert outside == [], f"marked netns outside tests/netns (make test would run them in neither phase): {outside}"
