"""The shell blocks of README.md and docs/, run as a user would type them in a fresh directory.

Every ```sh block either runs here or is marked, on the line before it, with why it cannot:
``<!-- readme-test: skip: needs a GPU -->``; a file whose every block needs the same thing says so once, anywhere
in it: ``<!-- readme-test: skip-all: needs a Kubernetes cluster -->``. A block that runs does so with bash
(``-euo pipefail``) in one temporary directory per document, holding a fresh copy of the repository's
``examples/``, with the ``topo-tune`` of this checkout first on ``PATH`` and no ``TOPO_TUNE_*`` variable set: as
written, relative paths included. A document's blocks run in order in that directory, so a block may use what
an earlier one left (the demo's database). Background jobs a block starts (``&``) are stopped when it ends.

The one change made to the text: the controller's port 50051 becomes a free port (and
``TOPO_TUNE_CONTROLLER`` names it, the address the admin commands default to), so two runs never collide.

Non-goals: checking the commands' output beyond their exit status (the command's own tests do).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^(\s*)```sh\s*$")
_SKIP = re.compile(r"<!--\s*readme-test:\s*skip:\s*(.+?)\s*-->")
_SKIP_ALL = re.compile(r"<!--\s*readme-test:\s*skip-all:\s*(.+?)\s*-->")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    text: str
    skip: str
    """Why it does not run here ("": it runs)."""

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def shell_blocks(document: Path) -> list[Block]:
    lines = document.read_text(encoding="utf-8").splitlines()
    whole = next((m.group(1) for line in lines if (m := _SKIP_ALL.search(line))), "")
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        indent, start = fence.group(1), index
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index].removeprefix(indent))
            index += 1
        marked = _SKIP.search(lines[start - 1]) if start else None
        blocks.append(Block(document, start + 1, "\n".join(body) + "\n", whole or (marked.group(1) if marked else "")))
        index += 1
    return blocks


def test_every_shell_block_runs_or_says_why_not() -> None:
    blocks = [block for document in DOCUMENTS for block in shell_blocks(document)]
    assert len(blocks) > 20, "the documents' sh blocks were found"
    runnable = [block.name for block in blocks if not block.skip]
    assert any(name.startswith("README.md") for name in runnable), "the README has blocks that run"


def _environment(port: int) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_TUNE_")}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    environment["TOPO_TUNE_CONTROLLER"] = f"127.0.0.1:{port}"
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return environment


@pytest.mark.timeout(900)  # the demo runs in full: minutes on two busy cores (benchmarks/results/demo.md)
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if any(not b.skip for b in shell_blocks(d))], ids=str)
def test_the_documents_blocks_run_as_written(document: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    port = free_port()
    for block in shell_blocks(document):
        if block.skip:
            continue
        script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n"
        script += block.text.replace("50051", str(port))
        ran = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=_environment(port),
            capture_output=True,
            text=True,
            timeout=840,
            check=False,
        )
        assert ran.returncode == 0, f"{block.name} failed:\n{block.text}\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
