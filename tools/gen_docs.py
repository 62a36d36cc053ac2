"""Regenerate the docs pages that are rendered from code: ``docs/nccl-variables.md`` (the knob catalogue).

Usage: ``python tools/gen_docs.py`` (``make docs``). ``tests/test_knob_catalogue.py`` fails when the
committed page differs from what this writes.
"""

from __future__ import annotations

from pathlib import Path

from topo_tune.nccl import variables as catalogue
from topo_tune.nccl.docs_table import render

ROOT = Path(__file__).resolve().parent.parent
PAGES = {ROOT / "docs" / "nccl-variables.md": lambda: render(catalogue.CATALOGUE)}


def main() -> None:
    for path, page in PAGES.items():
        path.write_text(page(), encoding="utf-8")
        print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
