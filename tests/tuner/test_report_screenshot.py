"""The committed screenshot of the demo's report is not older than the code that renders the report."""

from __future__ import annotations

from tools import report_sources


def test_the_report_screenshot_was_taken_with_today_s_report_code() -> None:
    stamped = report_sources.STAMP.read_text(encoding="utf-8").strip()
    assert stamped == report_sources.digest(), (
        "the report code changed since docs/report-demo.png was taken: run `make report-screenshot`"
    )
    assert len(report_sources.sources()) > 3, "the report's sources were found"
