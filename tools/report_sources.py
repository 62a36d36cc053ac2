"""The digest of the code that renders ``report.html``, stored beside its screenshot ``docs/report-demo.png``.

``make report-screenshot`` writes ``docs/report-demo.sources`` after taking the screenshot;
``tests/tuner/test_report_screenshot.py`` fails when the report code changed since, so the committed picture
is never older than the report it shows. Usage: ``python tools/report_sources.py [--write]``.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TUNER = ROOT / "topo_tune" / "tuner"
STAMP = ROOT / "docs" / "report-demo.sources"


def sources() -> list[Path]:
    """What decides how the report looks: its package, the summary it renders and the speedup texts."""
    return sorted([*(TUNER / "report").glob("*.py"), TUNER / "study_summary.py", TUNER / "speedup_text.py"])


def digest() -> str:
    h = hashlib.sha256()
    for path in sources():
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def main() -> None:
    if "--write" in sys.argv[1:]:
        STAMP.write_text(digest() + "\n", encoding="utf-8")
    print(digest())


if __name__ == "__main__":
    main()
