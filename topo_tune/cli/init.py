"""``topo-tune init``: the one-shot job — discover, probe, tune, prove, write the outputs."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from topo_tune.cli.connection import client_tls, client_tls_options, resolve_token, token_options
from topo_tune.client import AdminClient
from topo_tune.cluster_config import ClusterConfig, load_cluster_config
from topo_tune.tuner.study import StudyProgress

_PATH = click.Path(path_type=Path, dir_okay=False)


class _LoopThread:
    """An asyncio loop in a thread, for the embedded controller and agents while the pass runs here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="embedded-cluster", daemon=True)
        self._thread.start()

    def run(self, coroutine: object, timeout: float | None = None) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


@contextmanager
def _controller(
    cluster: ClusterConfig, output: Path, token_file: Path | None, token: str | None, tls: object
) -> Iterator[tuple[AdminClient, str]]:
    """An admin client to the remote controller of cluster.yaml, or to an embedded one (with local agents)."""
    if cluster.controller.address:
        resolved = resolve_token(
            token_file or (Path(cluster.controller.token_file) if cluster.controller.token_file else None), token
        )
        with AdminClient(cluster.controller.address, token=resolved, tls=tls, timeout_s=60) as client:  # type: ignore[arg-type]
            yield client, f"sqlite:///{output / 'study.db'}"
        return
    from topo_tune.local_cluster import EmbeddedCluster  # noqa: PLC0415 - only the embedded path needs the daemons

    embedded = EmbeddedCluster(cluster, output / ".topo-tune")
    loop = _LoopThread()
    try:
        loop.run(embedded.start(local_agents=cluster.backend in ("sim", "gloo")), timeout=120)
        with AdminClient(embedded.address, token=embedded.token, timeout_s=60) as client:
            yield client, embedded.database_url
    finally:
        try:
            loop.run(embedded.stop(), timeout=120)
        finally:
            loop.close()


@click.command()
@click.option("--cluster-config", "config_file", type=_PATH, required=True, help="cluster.yaml to tune.")
@click.option(
    "--output",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("topo-tune-output"),
    show_default=True,
    help="Where nccl.conf, nccl_tuner.conf, hostfile, rankmap.json, summary.json and report.html go.",
)
@click.option(
    "--node-timeout",
    type=click.FloatRange(1, 3600),
    default=120,
    show_default=True,
    help="Seconds to wait for every node of cluster.yaml to be ready.",
)
@token_options
@client_tls_options
def init(
    config_file: Path,
    output: Path,
    node_timeout: float,
    token_file: Path | None,
    token: str | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Tune NCCL for the cluster in cluster.yaml, in one pass: discover, probe, search, prove, write.

    Without `controller.address` in the file, an embedded controller (SQLite in OUTPUT) runs for the pass,
    and for `sim` and `gloo` clusters this command starts the nodes' agents itself. The result is either a
    configuration proven faster than NCCL's defaults, or a plain "keep NCCL's defaults". Ctrl-C leaves a
    consistent database; the same command resumes the study.

    \b
    Examples:
      topo-tune init --cluster-config examples/demo-cluster.yaml --output out/
      topo-tune init --cluster-config examples/local-gloo.yaml
    """
    from topo_tune.tuning_pass import run_pass  # noqa: PLC0415 - the tuner stack loads only for this command

    cluster = load_cluster_config(config_file)
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.BadParameter(
            f"cannot create {output}: {error.strerror or error}", param_hint="'--output'"
        ) from None
    console = Console(stderr=True)
    simulated = " (SIMULATED: sim backend)" if cluster.backend == "sim" else ""
    console.print(f"[bold]topo-tune init[/bold] {config_file} → {output}{simulated}")
    with (
        _controller(cluster, output, token_file, token, client_tls(tls_ca, tls_cert, tls_key)) as (client, storage),
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            console=console,
            transient=False,
        ) as progress,
    ):
        task = progress.add_task("starting", total=None, best="", eta="")

        def status(text: str) -> None:
            progress.update(task, description=text)

        def study_progress(update: StudyProgress) -> None:
            best = f"best {update.best_value:.3f}x" if update.best_value is not None else ""
            eta = f"ETA {update.eta_s:.0f}s" if update.eta_s is not None else ""
            progress.update(
                task, description=f"{update.phase}", completed=update.done, total=update.total, best=best, eta=eta
            )

        result = run_pass(
            cluster,
            client,
            output=output,
            storage=storage,
            node_timeout_s=node_timeout,
            on_status=status,
            on_progress=study_progress,
        )
    summary = json.loads((output / "summary.json").read_text())
    outcome = result.outcome
    counted = sum(1 for t in outcome.trials if not t.superseded)
    console.print(f"{counted} trials on {len(result.nodes)} nodes{simulated}")
    if outcome.chosen is None:
        console.print("[bold]Result: keep NCCL's defaults[/bold] — no configuration beat them beyond noise.")
    else:
        chosen = outcome.chosen
        console.print(
            f"[bold]Result: config {result.written.config_version.id}[/bold], "
            f"{chosen.speedup:.3f}x the defaults (weighted geometric mean), rank order "
            f"{chosen.config.rank_order.name}"
        )
        tuned = chosen.config.tuned_env(outcome.site_fixed)
        for key, value in sorted(tuned.items()):
            console.print(f"  {key}={value}")
    click.echo(json.dumps({"config_version": summary.get("config_version"), "output": str(output)}, indent=None))
    for name in result.written.files:
        console.print(f"  wrote {output / name}")
