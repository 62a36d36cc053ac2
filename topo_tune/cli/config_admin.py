"""``topo-tune admin config``: the config versions the controller keeps."""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data, emit_line, emit_lines, emit_table
from topo_tune.client.admin import AdminClient
from topo_tune.ids import ConfigVersionId
from topo_tune.security.safe_write import write_file
from topo_tune.wire.plain_data import to_data


@admin.group("config")
def config_versions() -> None:
    """Config versions: immutable, content-addressed file sets with their provenance."""


@config_versions.command("list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@connected
def list_versions(client: AdminClient, fmt: str, limit: int) -> None:
    """List stored config versions, newest first."""
    found = client.list_config_versions(limit=limit)
    if fmt != "table":
        emit_data([to_data(v) for v in found], fmt)
        return
    rows = [
        (
            v.id,
            v.created_at.ToJsonString(),
            v.provenance.get("nccl_version", "-"),
            v.provenance.get("study", "-"),
            "yes" if v.provenance.get("simulated") == "true" else "no",
        )
        for v in found
    ]
    emit_table(f"{len(found)} config versions", ("ID", "CREATED", "NCCL", "STUDY", "SIMULATED"), rows)


@config_versions.command()
@click.argument("version_id", metavar="ID")
@connected
def show(client: AdminClient, fmt: str, version_id: str) -> None:
    """Show a version's provenance and files."""
    found = client.get_config_version(ConfigVersionId(version_id))
    if fmt != "table":
        emit_data(to_data(found), fmt)
        return
    rows = sorted(found.provenance.items())
    stopped = "stopped (kill switch set)" + (f" {found.learning_stopped_why}" if found.learning_stopped_why else "")
    rows.append(("learning", stopped if found.learning_stopped else "allowed"))
    emit_table(f"config version {found.id}", ("PROVENANCE", "VALUE"), rows)
    for name in sorted(found.files):
        emit_line(f"--- {name}")
        emit_lines(found.files[name], nl=not found.files[name].endswith("\n"))


@config_versions.command()
@click.argument("old_id", metavar="OLD")
@click.argument("new_id", metavar="NEW")
@connected
def diff(client: AdminClient, fmt: str, old_id: str, new_id: str) -> None:
    """Unified diff of two versions' files."""
    old, new = client.get_config_version(ConfigVersionId(old_id)), client.get_config_version(ConfigVersionId(new_id))
    for name in sorted(set(old.files) | set(new.files)):
        lines = difflib.unified_diff(
            old.files.get(name, "").splitlines(keepends=True),
            new.files.get(name, "").splitlines(keepends=True),
            fromfile=f"{old.id}/{name}",
            tofile=f"{new.id}/{name}",
        )
        emit_lines("".join(lines), nl=False)


@config_versions.command()
@click.argument("version_id", metavar="ID")
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path, file_okay=False), required=True, help="Target directory."
)
@connected
def export(client: AdminClient, fmt: str, version_id: str, directory: Path) -> None:
    """Write a version's files into a directory (e.g. for NCCL_CONF_FILE on a machine without an agent)."""
    found = client.get_config_version(ConfigVersionId(version_id))
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in sorted(found.files.items()):
        write_file(directory / name, content)
        emit_line(f"wrote {directory / name}")
