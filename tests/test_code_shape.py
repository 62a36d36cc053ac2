"""The tuner and the controller stay readable: no module over 500 lines, no function over 60, no three
same-typed values passed by position."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "topo_tune"
MODULES = sorted(
    p for name in ("tuner", "controller") for p in (PACKAGE / name).rglob("*.py") if "migrations" not in p.parts
)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert source.count("\n") <= MAX_MODULE_LINES, f"{path.name}: split it by concept"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


def test_the_packages_were_found() -> None:
    assert len(MODULES) > 50


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_three_values_of_one_type_are_passed_by_name(path: Path) -> None:
    """Three positional parameters of one annotation (three ``str``, three ``float``) are easy to pass in the
    wrong order and no type checker notices; after the first two, such parameters are keyword-only."""
    crowded = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        positional = [a for a in (*node.args.posonlyargs, *node.args.args) if a.arg not in ("self", "cls")]
        counts = Counter(ast.unparse(a.annotation) for a in positional if a.annotation is not None)
        crowded += [f"{node.name} ({n} x {annotation})" for annotation, n in counts.items() if n >= 3]
    assert not crowded, f"{path.name}: make them keyword-only: {', '.join(crowded)}"
