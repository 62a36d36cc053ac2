"""docs/architecture.md, the map for someone about to change something, names only paths that exist.

A module moved or renamed leaves its old name in the map unless this fails: every path in backquotes (a file
with its extension, or a folder ending in ``/``) is looked up from the repository, from ``topo_tune/``, and for a
bare file name anywhere under ``topo_tune/``, ``protos/`` or ``docs/``; every relative Markdown link from ``docs/``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"`([A-Za-z0-9_./-]+?(?:\.py|\.md|\.json|\.proto|\.c|/))(?:::[A-Za-z0-9_]+)?`")
LINK = re.compile(r"\]\(([^)#:]+)(?:#[^)]*)?\)")


def _exists(named: str) -> bool:
    if "/" not in named.rstrip("/"):
        if named.endswith("/"):
            return any(p.is_dir() for p in (ROOT / "topo_tune").rglob(named.rstrip("/")))
        return any(any(base.rglob(named)) for base in (ROOT / "topo_tune", ROOT / "protos", ROOT / "docs"))
    return any((base / named).exists() for base in (ROOT, ROOT / "topo_tune", ROOT / "docs"))


def test_every_path_the_architecture_map_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    named = sorted(set(PATH.findall(text)))
    assert len(named) > 40, "the map names the modules it speaks of"
    missing = [path for path in named if not _exists(path)]
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_link_of_the_architecture_map_leads_to_a_file() -> None:
    links = LINK.findall(DOC.read_text(encoding="utf-8"))
    assert links, "the map links the README and the generated references"
    missing = [link for link in links if not (DOC.parent / link).exists()]
    assert missing == [], f"docs/architecture.md links to files that do not exist: {missing}"
