"""``topo-tune config``: the cluster.yaml schema and a validator."""

from __future__ import annotations

from pathlib import Path

import click

from topo_tune.cli.output import emit_line
from topo_tune.config.cluster import json_schema_text, load_cluster_config


@click.group()
def config() -> None:
    """Inspect and check cluster.yaml files."""


@config.command()
def schema() -> None:
    """Print the JSON Schema of cluster.yaml (for editors and CI checks)."""
    click.echo(json_schema_text(), nl=False)


@config.command()
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
def validate(file: Path) -> None:
    """Check FILE; print a summary, or the first bad field and exit 1."""
    cluster = load_cluster_config(file)
    nodes = sum(len(rack.nodes) for rack in cluster.racks)
    emit_line(f"{file}: valid ({len(cluster.racks)} racks, {nodes} nodes, backend {cluster.backend})")
