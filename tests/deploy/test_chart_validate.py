"""The chart's objects are valid Kubernetes, its lint is clean, and its schema matches its values.

Every rendered object is checked against the Kubernetes OpenAPI schemas bundled by kubernetes-validate,
in strict mode (unknown fields are errors), for the oldest release we support and the newest it bundles.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from tests.deploy.chart_render import CHART_DIR, REPO_ROOT, Manifest, ci_values, render

KUBERNETES_VERSIONS = ["1.30.0", latest_version()]
# Custom resources have no bundled schema; their fields are asserted in test_chart_render.py instead.
CUSTOM_KINDS = {"ServiceMonitor"}

OPTION_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    **ci_values(),
    "everything": {
        "tls": {"enabled": True, "existingSecret": "tls", "requireClientCert": True},
        "database": {"external": {"enabled": True, "existingSecret": "db"}},
        "rbac": {"cordonNodes": True},
        "serviceMonitor": {"enabled": True, "relabelings": [{"action": "labeldrop", "regex": "pod"}]},
        "agent": {
            "hostNetwork": True,
            "rack": "r1",
            "extraArgs": ["--verbose"],
            "extraEnv": [{"name": "NCCL_DEBUG", "value": "WARN"}],
            "extraVolumes": [{"name": "ib", "hostPath": {"path": "/dev/infiniband"}}],
            "extraVolumeMounts": [{"name": "ib", "mountPath": "/dev/infiniband"}],
            "podAnnotations": {"a": "b"},
        },
        "controller": {
            "replicas": 2,
            "priorityClassName": "high",
            "extraEnv": [{"name": "X", "value": "1"}],
            "nodeSelector": {"role": "system"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        },
        "networkPolicy": {
            "extraGrpcFrom": [{"namespaceSelector": {"matchLabels": {"team": "ml-platform"}}}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
        "imagePullSecrets": [{"name": "registry"}],
    },
}


def _objects(option_set: str) -> list[Manifest]:
    return list(render(OPTION_SETS[option_set]).objects)


@pytest.mark.parametrize("kubernetes", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("option_set", sorted(OPTION_SETS))
def test_every_object_is_valid_kubernetes_in_strict_mode(option_set: str, kubernetes: str) -> None:
    objects = _objects(option_set)
    assert objects
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']} ({option_set}, Kubernetes {kubernetes})"
        if obj["kind"] in CUSTOM_KINDS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(obj, kubernetes, strict=True)
            continue
        try:
            kubernetes_validate.validate(obj, kubernetes, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{where}: {error.message}")


def test_strict_validation_would_catch_a_misspelt_field() -> None:
    # Guards the test above against validating nothing: an unknown field must be an error.
    deployment = next(obj for obj in _objects("default") if obj["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="securityContex"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("kube_version", [f"v{version}" for version in KUBERNETES_VERSIONS])
@pytest.mark.parametrize("option_set", sorted(OPTION_SETS))
def test_helm_lint_strict_is_clean(option_set: str, kube_version: str) -> None:
    report = helm_python.lint(CHART_DIR, OPTION_SETS[option_set], strict=True, kube_version=kube_version)
    assert report["errors"] == []
    # Severity 2 = warning, 3 = error; info (1) such as "icon is recommended" is fine.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_chart_versions_follow_the_package() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    # The chart passes flags of this application version; the image tag defaults to appVersion.
    assert chart["appVersion"] == project["version"]


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of every declared property, down to free-form objects (no `properties`)."""
    paths: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.add(path)
        if "properties" in sub and sub.get("additionalProperties") is False:
            paths |= _schema_paths(sub, f"{path}.")
    return paths


def _values_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths.add(path)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            paths |= _values_paths(value, sub, f"{path}.")
    return paths


def test_values_schema_and_values_yaml_declare_the_same_keys() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    declared = _schema_paths(schema)
    defaulted = _values_paths(values, schema)
    assert sorted(defaulted - declared) == [], "values.yaml keys missing from values.schema.json"
    assert sorted(declared - defaulted) == [], "values.schema.json keys without a default in values.yaml"


def test_every_closed_object_in_the_schema_rejects_unknown_keys() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())

    def walk(node: dict[str, Any], path: str) -> None:
        if "properties" in node and path != "clusterConfig":
            assert node.get("additionalProperties") is False, f"{path or '<root>'} accepts unknown keys"
            for key, sub in node["properties"].items():
                walk(sub, f"{path}.{key}".lstrip("."))

    walk(schema, "")
    assert schema["additionalProperties"] is False


def test_packaged_chart_renders_like_the_directory(tmp_path: Path) -> None:
    # What users install from a chart repository is the .tgz: .helmignore must keep the docs and drop ci/.
    archive = helm_python.package(CHART_DIR, destination=tmp_path)
    with helm_python.Chart.load(archive) as chart:
        files = {entry["name"] for entry in chart.files}
        packaged = chart.render({}, name="tt", namespace="gpu-tuning", is_install=True)
        assert chart.schema is not None
    assert "README.md" in files
    assert not any(name.startswith("ci/") for name in files)
    with helm_python.Chart.load(CHART_DIR) as chart:
        from_dir = chart.render({}, name="tt", namespace="gpu-tuning", is_install=True)
    secret = "topo-tune/templates/secret.yaml"  # holds a random token
    assert {k: v for k, v in packaged.items() if k != secret} == {k: v for k, v in from_dir.items() if k != secret}
