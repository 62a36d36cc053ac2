"""``topo-tune workload import``: the job's own collectives, from its traces, logs or plugin records, as weights.

Prints the ``workload:`` block for ``cluster.yaml`` (``-o yaml``, the default) or the whole analysis as JSON
(``-o json``); with ``--cluster-config FILE --write`` it replaces that file's block in place. ``--database``
weighs by the study's measured baseline times. Bad input is one line naming the file, and nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from topo_tune.cli.output import emit_line, emit_lines
from topo_tune.workload.calls import per_rank
from topo_tune.workload.file_kinds import read_workload_file
from topo_tune.workload.study_baseline import study_baseline
from topo_tune.workload.weights import weigh
from topo_tune.workload.workload_block import as_data, source_line, workload_block, write_block


@click.group()
def workload() -> None:
    """The job's own workload: collectives and sizes from its traces, as cluster.yaml weights."""


@workload.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--output", "-o", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option(
    "--cluster-config",
    "cluster_config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --write: the cluster.yaml whose workload: block to replace (a backup FILE.bak beside it).",
)
@click.option("--write", is_flag=True, help="Replace --cluster-config's workload: block in place.")
@click.option(
    "--database",
    help="A topo-tune database URL (e.g. sqlite:///out/.topo-tune/topo-tune.db): weigh by its study's "
    "measured baseline times.",
)
@click.option("--study", help="With --database: the study whose baseline to use (default: the newest).")
def import_(
    files: tuple[Path, ...],
    output: str,
    cluster_config: Path | None,
    write: bool,
    database: str | None,
    study: str | None,
) -> None:
    """Read PyTorch profiler traces (.json, .json.gz), NCCL Inspector logs or tuner plugin records
    (one file per rank, or one rank only) and print the workload: block of cluster.yaml."""
    if write and cluster_config is None:
        raise click.UsageError("--write needs --cluster-config FILE")
    if study is not None and database is None:
        raise click.UsageError("--study needs --database")
    job = per_rank(read_workload_file(path) for path in files)
    baseline = study_baseline(database, study=study)[1] if database is not None else None
    weights = weigh(job, baseline=baseline)
    if write:
        assert cluster_config is not None
        backup = write_block(cluster_config, weights)
        emit_line(f"{cluster_config}: workload replaced ({source_line(weights)}); the old file is {backup}", err=True)
    if output == "json":
        click.echo(json.dumps(as_data(weights), indent=2))
    else:
        emit_lines(workload_block(weights), nl=False)
