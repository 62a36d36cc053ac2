"""An allow-list pattern accepts exactly what it spells: no value with a trailing newline gets through.

Python's ``$`` also matches just before a final newline, so ``re.compile(r"^[a-z]+$").match("ok\\n")`` matches:
a node name, job id, variable name or version id of an allow-list would let ``"name\\n"`` through, and the
newline would reach logs, terminals and file names. Patterns end with ``\\Z`` (the end of the text) instead, and
a pattern shared with pydantic (whose engine has no ``\\Z``, and whose ``$`` is the end of the text) is used with
``fullmatch``. Found by the cluster-file fuzz: a key ``"A\\n"`` was named raw, on two lines.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.config.cluster import loads_cluster_config
from topo_tune.controller import names
from topo_tune.errors import ConfigError, ValidationError
from topo_tune.nccl.value_types import Int
from topo_tune.versions.version import is_version_id

PACKAGE = Path(__file__).resolve().parent.parent / "topo_tune"


def _compiled_patterns(path: Path) -> list[tuple[int, str]]:
    """(line, pattern) of every ``re.compile`` of a literal in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "compile"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str | bytes)
        ):
            value = node.args[0].value
            found.append((node.lineno, value if isinstance(value, str) else value.decode("latin-1")))
    return found


def test_no_compiled_pattern_ends_with_a_dollar() -> None:
    offending = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {pattern}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, pattern in _compiled_patterns(path)
        if pattern.endswith("$") and not pattern.endswith("\\$")
    ]
    assert not offending, "end the pattern with \\Z ($ also matches before a final newline):\n" + "\n".join(offending)


def _refused_by_names(check: Callable[[str, str], object]) -> Callable[[str], bool]:
    def refused(value: str) -> bool:
        try:
            check(value, "field")
        except ValidationError:
            return True
        return False

    return refused


REFUSALS: dict[str, tuple[Callable[[str], bool], str]] = {
    "node name": (_refused_by_names(names.node_name), "node-1"),
    "job id": (_refused_by_names(names.job_id), "job-1"),
    "command id": (_refused_by_names(names.command_id), "bj-1-0"),
    "token": (_refused_by_names(names.token), "tok.en"),
    "study id": (_refused_by_names(names.study_id), "study-1"),
    "environment variable name": (lambda v: EnvPolicy().violation(v, "WARN", {}) is not None, "NCCL_DEBUG"),
    "integer knob value": (lambda v: Int(1, 64).reason(v) is not None, "8"),
    "version id": (lambda v: not is_version_id(v), "cv-0123456789abcdef"),
}


@pytest.mark.parametrize("what", sorted(REFUSALS))
def test_a_value_with_a_trailing_newline_is_refused_where_the_value_alone_is_accepted(what: str) -> None:
    refused, good = REFUSALS[what]
    assert not refused(good), f"{what}: {good!r} should pass"
    assert refused(good + "\n"), f"{what}: {good!r} with a trailing newline got through"


def test_an_odd_key_in_the_cluster_file_is_named_on_one_line() -> None:
    with pytest.raises(ConfigError) as error:
        loads_cluster_config("? 'A\n\n'")
    assert "\n" not in str(error.value)
    assert '["A\\n"]: unknown key' in str(error.value)


def test_a_refused_variable_name_is_shown_escaped() -> None:
    violation = EnvPolicy().violation("NCCL_ALGO\n\x1b[2J", "Ring", {})
    assert violation is not None
    assert "\n" not in str(violation) and "\x1b" not in str(violation)
    assert str(EnvPolicy().violation("nccl_algo", "Ring", {})).startswith("nccl_algo: ")
