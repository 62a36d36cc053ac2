"""The install commands in the documentation work against the chart as it is.

Every `helm install`/`helm upgrade` command in docs/kubernetes.md, the chart README and the README is
rendered with its own --set/--set-json/-f flags, and the objects the docs name in kubectl commands must exist
in that render.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.deploy.chart_render import CHART_DIR, REPO_ROOT, Rendered, render

# The README's "Install on Kubernetes" section is held to the same standard.
DOCS = [REPO_ROOT / "docs" / "kubernetes.md", CHART_DIR / "README.md", REPO_ROOT / "README.md"]
SET_PARSERS = {
    "--set": helm_python.parse_set_string,
    "--set-string": helm_python.parse_set_string_values,
    "--set-json": helm_python.parse_set_json,
}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _shell_commands(doc: Path) -> Iterator[str]:
    for block in re.findall(r"```sh\n(.*?)```", doc.read_text(), flags=re.DOTALL):
        yield from (line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip())


def _helm_installs() -> list[tuple[str, list[str]]]:
    return [
        (f"{doc.name}: {command}", shlex.split(command))
        for doc in DOCS
        for command in _shell_commands(doc)
        if command.startswith(("helm install ", "helm upgrade "))
    ]


def _render_command(argv: list[str]) -> Rendered:
    """Render what `helm install|upgrade [--install] RELEASE CHART [flags]` would install."""
    positional: list[str] = []
    values: dict[str, Any] = {}
    namespace = "default"
    args = iter(argv[2:])
    for arg in args:
        if arg in SET_PARSERS:
            values = _merge(values, SET_PARSERS[arg](next(args)))
        elif arg in ("-f", "--values"):
            values = _merge(values, yaml.safe_load((REPO_ROOT / next(args)).read_text()))
        elif arg in ("--namespace", "-n"):
            namespace = next(args)
        elif arg.startswith("-"):
            assert arg in ("--install", "--create-namespace"), f"flag the test does not know: {arg}"
        else:
            positional.append(arg)
    release, chart = positional
    assert chart == "charts/topo-tune"
    return render(values, release=release, namespace=namespace)


def test_the_docs_show_install_commands() -> None:
    assert len(_helm_installs()) >= 5


@pytest.mark.parametrize(("where", "argv"), _helm_installs(), ids=lambda value: str(value)[:60])
def test_documented_install_commands_render(where: str, argv: list[str]) -> None:
    rendered = _render_command(argv)
    assert rendered.controller and rendered.agent, where


def test_inline_set_flags_render() -> None:
    inline = re.findall(r"`(--set(?:-json|-string)? '[^`]+'|--set(?:-json|-string)? [^`' ]+)`", DOCS[0].read_text())
    assert inline
    for snippet in inline:
        flag, expression = shlex.split(snippet)
        render(SET_PARSERS[flag](expression))


def test_objects_named_in_kubectl_commands_exist() -> None:
    (install,) = [argv for _, argv in _helm_installs() if argv[:2] == ["helm", "install"]][:1]
    rendered = _render_command(install)
    referenced = 0
    for doc in DOCS:
        for command in _shell_commands(doc):
            if "kubectl" not in command:
                continue
            for kind, name in re.findall(r"\b(deployment|daemonset|service)/([\w-]+)", command):
                kinds = {"deployment": "Deployment", "daemonset": "DaemonSet", "service": "Service"}
                assert rendered.find(kinds[kind], name), f"{doc.name}: {command}"
                referenced += 1
            for name in re.findall(r"get secret ([\w-]+)", command):
                assert rendered.find("Secret", name), f"{doc.name}: {command}"
                referenced += 1
    assert referenced >= 4
