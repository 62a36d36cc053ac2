"""The exception tree: every public exception class of the package is defined in ``topo_tune.errors``."""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import topo_tune
from topo_tune import errors

PACKAGE = Path(topo_tune.__file__).parent
EXCEPTION_NAMES = {
    name
    for module in (builtins, errors)
    for name, value in vars(module).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def test_no_public_exception_class_is_defined_outside_errors() -> None:
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (path.name == "errors.py" and path.parent == PACKAGE) or "v1" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue  # a private class never leaves its module
            if any(_base_name(base) in EXCEPTION_NAMES for base in node.bases):
                elsewhere.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    assert elsewhere == [], "define these in topo_tune/errors.py"


def test_every_class_of_the_tree_is_a_topo_tune_error_and_documented() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, BaseException)]
    assert len(classes) > 30
    assert all(issubclass(c, errors.TopoTuneError) for c in classes)
    doc = errors.__doc__ or ""
    assert [c.__name__ for c in classes if c.__name__ not in doc] == []


def test_input_errors_are_still_value_errors_for_their_parsers() -> None:
    for kind in (errors.SpecError, errors.SweepError, errors.TunerTableError, errors.NcclXmlError, errors.CpuListError):
        assert issubclass(kind, ValueError)
    assert issubclass(errors.LauncherBusy, RuntimeError)
    assert issubclass(errors.AlreadyExists, errors.ConflictError)
