"""``topo-tune init``: the one-shot job — discover, probe, tune, prove, write the outputs."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.cli import logs
from topo_tune.cli.connection import client_tls, client_tls_options, resolve_token, token_options
from topo_tune.cli.output import console_line, emit_line
from topo_tune.cli.phases import PhaseDisplay
from topo_tune.client.admin import AdminClient
from topo_tune.config.cluster import ClusterConfig, NodeConfig, load_cluster_config
from topo_tune.errors import ConfigError, EnvPolicyError
from topo_tune.tuner.report.tables import table_rows
from topo_tune.tuner.study_records import plural, trial_count_line
from topo_tune.tuner.study_summary import verdict_lines
from topo_tune.tuner.workload_gain import gain_line
from topo_tune.tuning_pass.remote_port import RESTART_WAIT_S, RemotePort

if TYPE_CHECKING:
    from topo_tune.cli.local_cluster import EmbeddedCluster

_PATH = click.Path(path_type=Path, dir_okay=False)
INTERRUPT_GRACE_S = 20.0
"""How long init may take to stop after Ctrl-C before it ends at once (a second Ctrl-C ends it at once too)."""


@contextmanager
def _interruptible(say_how_to_resume: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` as usual, and init stops in order; it ends at once, with status 130,
    at a second Ctrl-C or when it has not ended ``INTERRUPT_GRACE_S`` after the first.

    Every finished trial is committed when it finishes, so ending at once loses none (as a ``kill -9`` would
    not). The bound keeps Ctrl-C's promise when stopping in order hangs (the embedded daemons' shutdown) or the
    interrupt is lost on the way (Python drops one raised in a finaliser). An inherited SIG_IGN (a background
    job's) is left alone: such an init is not meant to be interrupted from a terminal.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield  # SIGINT ignored (a background job) or handled by whoever runs init: theirs to decide
        return

    def end_now() -> None:
        say_how_to_resume()
        os._exit(130)

    def on_interrupt(_number: int, _frame: object) -> None:
        if watchdog.is_alive():
            end_now()
            return
        watchdog.start()
        raise KeyboardInterrupt

    watchdog = threading.Timer(INTERRUPT_GRACE_S, end_now)
    watchdog.daemon = True
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        watchdog.cancel()  # init stopped in order (what is left is printing and leaving)
        signal.signal(signal.SIGINT, previous)


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


def _worker_env(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {value!r}")
        env[key] = val
    try:
        EnvPolicy().check(env)
    except EnvPolicyError as error:
        raise click.BadParameter(str(error)) from None
    return env


def _with_worker_env(cluster: ClusterConfig, env: dict[str, str]) -> ClusterConfig:
    """``cluster`` with ``env`` over every node's ``workerEnv`` (what ``--worker-env`` means)."""
    racks = []
    for rack in cluster.racks:
        nodes = [node.model_copy(update={"worker_env": {**node.worker_env, **env}}) for node in rack.nodes]
        racks.append(rack.model_copy(update={"nodes": nodes}))
    return cluster.model_copy(update={"racks": racks})


def _check_node_env(cluster: ClusterConfig) -> None:
    """Each node's ``workerEnv`` passes the agents' environment policy, or a ``ConfigError`` names the field."""
    for i, rack in enumerate(cluster.racks):
        for j, node in enumerate(rack.nodes):
            try:
                EnvPolicy().check(node.worker_env)
            except EnvPolicyError as error:
                raise ConfigError(f"racks[{i}].nodes[{j}].workerEnv", str(error)) from None


def _tell_how_to_join(
    console: Console, embedded: EmbeddedCluster, elsewhere: Sequence[str], token_dir: Path, node_timeout: float
) -> None:
    """Before the wait: the ``agent run`` line for each node that is not this machine, with its own credential."""
    from topo_tune.cli.local_cluster import agent_command, node_credential_file  # noqa: PLC0415 - embedded path only

    cluster = embedded.cluster
    rack_of = cluster.rack_of()
    nodes: dict[str, NodeConfig] = {node.name: node for rack in cluster.racks for node in rack.nodes}
    total = len(rack_of)
    console_line(
        console,
        f"{len(elsewhere)} of {total} nodes are not this machine: on each, start an agent (copy its own token "
        f"file, {token_dir}/agent-NODE.token, there first and keep it private, mode 0600). The controller listens on "
        f"{embedded.public_address} for {node_timeout:g} s (--node-timeout):",
    )
    for name in elsewhere:
        line = agent_command(
            nodes[name],
            rack=rack_of[name],
            backend=cluster.backend,
            controller=embedded.public_address,
            token_file=node_credential_file(token_dir, name, embedded.token),
        )
        console_line(console, f"  {line}")
    console_line(
        console,
        "For a fleet, run one long-lived controller instead (the Helm chart, or `topo-tune controller serve`) and "
        "set controller.address in cluster.yaml: agents then join once and stay.",
    )


@contextmanager
def _controller(
    cluster: ClusterConfig,
    output: Path,
    token_file: Path | None,
    tls: object,
    *,
    console: Console,
    node_timeout: float,
    controller_wait: float,
) -> Iterator[tuple[AdminClient, str]]:
    """An admin client to the remote controller of cluster.yaml, or to an embedded one.

    The embedded controller runs the agents of the nodes that are this machine; for the others it listens on
    every interface (cluster.yaml's controller.listen, when set) and prints how they join.
    """
    if cluster.controller.address:
        resolved = resolve_token(
            token_file,
            configured=Path(cluster.controller.token_file) if cluster.controller.token_file else None,
            configured_as="controller.tokenFile",
        )
        address = cluster.controller.address
        with AdminClient(address, token=resolved, tls=tls, timeout_s=60, reconnect_s=controller_wait) as client:  # type: ignore[arg-type]
            yield client, f"sqlite:///{output / 'study.db'}"
        return
    # Only the embedded path needs the daemons.
    from topo_tune.cli.local_cluster import EmbeddedCluster, ThisHost, nodes_here, token_file_for  # noqa: PLC0415

    _check_node_env(cluster)
    here, elsewhere = nodes_here(cluster, ThisHost.detect())
    workdir = output / ".topo-tune"
    embedded = EmbeddedCluster(cluster, workdir)
    agent_token = workdir / "agent-token"
    if elsewhere:
        section = cluster.controller
        _, _, port = section.listen.rpartition(":")
        embedded.listen = section.listen if "listen" in section.model_fields_set else f"0.0.0.0:{port}"
        embedded.token = token_file_for(agent_token)
    loop = _LoopThread()
    try:
        try:
            loop.run(embedded.start(local=here), timeout=120)
        except ConfigError as error:
            if error.field != "--listen":
                raise
            raise ConfigError(
                "controller.listen",
                f"{error.reason.split(';')[0]} (for the nodes elsewhere; is another controller there? set "
                "controller.listen in cluster.yaml)",
            ) from None
        if elsewhere:
            _tell_how_to_join(console, embedded, elsewhere, workdir, node_timeout)
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
@click.option(
    "--worker-env",
    "worker_env",
    multiple=True,
    callback=_worker_env,
    metavar="KEY=VALUE",
    help="Every benchmark worker of the agents init starts gets this, over any trial's value, e.g. "
    "NCCL_NVLS_ENABLE=0 where NVLink multicast must stay off; repeatable. Also printed in the `agent run` line "
    "for nodes elsewhere. Wins over a node's workerEnv in cluster.yaml.",
)
@click.option(
    "--controller-wait",
    type=click.FloatRange(0, 3600),
    default=RESTART_WAIT_S,
    show_default=True,
    help="Seconds to wait for a controller that stops answering mid-pass (a restart) before giving up.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what the pass would cost (benchmark jobs per phase, wall time and node-seconds at the backend's "
    "recorded per-job cost) from the file alone, then stop: no controller, agent or node is touched.",
)
@token_options
@client_tls_options
def init(
    config_file: Path,
    output: Path,
    node_timeout: float,
    worker_env: dict[str, str],
    controller_wait: float,
    dry_run: bool,
    token_file: Path | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Tune NCCL for the cluster in cluster.yaml, in one pass: discover, probe, search, prove, write.

    Without `controller.address` in the file, an embedded controller (SQLite in OUTPUT) runs for the pass,
    and this command starts the agent of every node that is this machine: an `nccl` node named by this host
    (or the only node of the file), every `sim` node, every `gloo` node without an address elsewhere. For
    the other nodes it prints the `agent run` line to start on each (with a token file it writes in OUTPUT)
    and waits, counting the ready nodes. The result is either a configuration proven faster than NCCL's
    defaults, or a plain "keep NCCL's defaults". Ctrl-C leaves a consistent database; the same command
    resumes the study. The terminal shows a line per phase; the INFO log goes to OUTPUT/.topo-tune/init.log
    (-v shows it on stderr too).

    \b
    Examples:
      topo-tune init --cluster-config examples/demo-cluster.yaml --output out/
      topo-tune init --cluster-config examples/demo-cluster.yaml --dry-run   # what it would cost
      topo-tune init --cluster-config examples/local-gloo.yaml
      topo-tune init --cluster-config examples/one-box.yaml    # one GPU machine, no other process
    """
    from topo_tune.tuner.outputs import CLUSTER_TIME  # noqa: PLC0415 - the tuner stack loads only for this command
    from topo_tune.tuning_pass.cluster_time import time_lines  # noqa: PLC0415
    from topo_tune.tuning_pass.run import run_pass  # noqa: PLC0415

    cluster = load_cluster_config(config_file)
    if dry_run:
        from topo_tune.tuning_pass.pass_estimate import estimate_pass  # noqa: PLC0415

        for line in estimate_pass(cluster).lines():
            emit_line(line)
        return
    if worker_env:
        if cluster.controller.address:
            raise click.UsageError(
                "--worker-env is for the agents init starts; with controller.address, give it to each `agent run`"
            )
        cluster = _with_worker_env(cluster, worker_env)
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.BadParameter(
            f"cannot create {output}: {error.strerror or error}", param_hint="'--output'"
        ) from None
    # Absolute from here on: the agents' benchmark workers run in their own job directories, where a
    # relative path would name another place.
    output = output.absolute()
    console = Console(stderr=True)
    log_file = logs.log_to_file(
        output / ".topo-tune" / "init.log", terminal_too=bool(click.get_current_context().meta.get(logs.LEVEL_CHOSEN))
    )
    logs.quiet_libraries()
    simulated = " (SIMULATED: sim backend)" if cluster.backend.simulated else ""
    console_line(console, f"topo-tune init {config_file} → {output}{simulated}", style="bold")
    console_line(console, f"log: {log_file} (-v shows it here)")
    tls = client_tls(tls_ca, tls_cert, tls_key)

    def say_how_to_resume() -> None:
        again = shlex.join(["topo-tune", *sys.argv[1:]])
        console_line(
            console,
            f"interrupted: every finished trial is kept in {output / '.topo-tune'}; "
            "the same command resumes the study:",
        )
        console_line(console, f"  {again}")

    try:
        with (
            _interruptible(say_how_to_resume),
            _controller(
                cluster,
                output,
                token_file,
                tls,
                console=console,
                node_timeout=node_timeout,
                controller_wait=controller_wait,
            ) as (client, storage),
            PhaseDisplay(console) as phases,  # a line per phase, a live bar on a terminal
        ):
            result = run_pass(
                cluster,
                RemotePort(
                    client,
                    restart_wait_s=controller_wait,
                    on_wait=lambda line: console_line(console, line),
                ),
                output=output,
                storage=storage,
                node_timeout_s=node_timeout,
                on_status=phases.status,
                on_progress=phases.study,
            )
    except KeyboardInterrupt:
        say_how_to_resume()
        raise click.exceptions.Exit(130) from None
    summary = json.loads((output / "summary.json").read_text())
    outcome = result.outcome
    counts = trial_count_line(outcome, cluster.search.budget)
    console_line(console, f"{counts}; on {plural(len(result.nodes), 'node')}{simulated}")
    console_line(console, f"{plural(len(outcome.proofs), 'finalist')} proven against the defaults")
    if outcome.chosen is None:
        console_line(console, "Result: keep NCCL's defaults", style="bold")
    else:
        chosen = outcome.chosen
        console_line(
            console,
            f"Result: config {result.written.config_version.id}, "
            f"{chosen.speedup:.3f}x the defaults (weighted geometric mean), rank order "
            f"{chosen.config.rank_order.name}",
            style="bold",
        )
        tuned = chosen.config.tuned_env(outcome.site_fixed)
        for key, value in sorted(tuned.items()):
            console_line(console, f"  {key}={value}")
        table = table_rows(chosen.config.tuner_table)
        if table:  # a table ships even with no NCCL_* variable: say what it sets
            console_line(
                console, f"  nccl_tuner.conf: {plural(len(table), 'row')} (the tuner plugin's table, as proven)"
            )
        elif not tuned:
            console_line(console, "  no NCCL setting changed: the rank order alone")
    click.echo(json.dumps({"config_version": summary.get("config_version"), "output": str(output)}, indent=None))
    for name in result.written.files:
        console_line(console, f"  wrote {output / name}")
    console_line(console, f"  wrote {output / CLUSTER_TIME}")
    for line in time_lines(result.cluster_time.to_json()):
        console_line(console, line)
    console_line(console, gain_line(summary["workload"]))
    # Last: what was decided per weighted bucket, with its bounds, and the trade-off when there is one.
    for line in verdict_lines(outcome):
        console_line(console, line)
