"""Render the Helm chart offline with Helm's own engine (helm-python-sdk) and index the objects.

Non-goals: talking to a cluster; Helm features that need one (`lookup` returns nothing here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "topo-tune"
CI_VALUES_DIR = CHART_DIR / "ci"
RELEASE = "tt"
NAMESPACE = "gpu-tuning"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """The objects of one render, plus NOTES.txt."""

    objects: tuple[Manifest, ...]
    notes: str

    def kinds(self) -> list[str]:
        return sorted(obj["kind"] for obj in self.objects)

    def all(self, kind: str) -> list[Manifest]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str) -> Manifest:
        found = [obj for obj in self.all(kind) if obj["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name!r}, found {[o['metadata']['name'] for o in self.all(kind)]}"
        return found[0]

    def find(self, kind: str, name: str) -> Manifest | None:
        found = [obj for obj in self.all(kind) if obj["metadata"]["name"] == name]
        return found[0] if found else None

    # The objects every test talks about: each exists once per render.
    @property
    def controller(self) -> Manifest:
        (deployment,) = self.all("Deployment")
        return deployment

    @property
    def agent(self) -> Manifest:
        (daemonset,) = self.all("DaemonSet")
        return daemonset

    @property
    def test_pod(self) -> Manifest:
        (pod,) = [pod for pod in self.all("Pod") if pod["metadata"]["annotations"]["helm.sh/hook"] == "test"]
        return pod


def render(values: Mapping[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE) -> Rendered:
    """Render like `helm template RELEASE charts/topo-tune -n NAMESPACE -f values` would."""
    with helm_python.Chart.load(CHART_DIR) as chart:
        manifests = chart.render(dict(values or {}), name=release, namespace=namespace, is_install=True)
    objects: list[Manifest] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Rendered(objects=tuple(objects), notes=notes)


def ci_values() -> dict[str, dict[str, Any]]:
    """The option sets shipped in charts/topo-tune/ci/ (usable with `helm template -f`), by file stem."""
    sets: dict[str, dict[str, Any]] = {}
    for path in sorted(CI_VALUES_DIR.glob("*-values.yaml")):
        sets[path.name.removesuffix("-values.yaml")] = yaml.safe_load(path.read_text())
    return sets


def containers(workload: Manifest) -> list[Manifest]:
    spec = workload["spec"]
    pod_spec = spec["template"]["spec"] if "template" in spec else spec
    result: list[Manifest] = pod_spec["containers"]
    return result


def pod_spec(workload: Manifest) -> Manifest:
    spec = workload["spec"]
    result: Manifest = spec["template"]["spec"] if "template" in spec else spec
    return result


def env_of(container: Manifest) -> dict[str, Manifest]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def mounts_of(container: Manifest) -> dict[str, Manifest]:
    return {mount["mountPath"]: mount for mount in container.get("volumeMounts", [])}


def volumes_of(workload: Manifest) -> dict[str, Manifest]:
    return {volume["name"]: volume for volume in pod_spec(workload).get("volumes", [])}


def flag_values(args: list[str]) -> dict[str, str]:
    """`--flag value` pairs of a container's args (a flag followed by another flag maps to "")."""
    values: dict[str, str] = {}
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[index + 1] if index + 1 < len(args) else "--"
            values[arg] = "" if following.startswith("--") else following
    return values
