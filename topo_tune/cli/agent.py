"""``topo-tune agent run``: the per-node agent daemon."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import click

from topo_tune.agent.bench.ranks_per_gpu import refusal
from topo_tune.agent.settings import AgentSettings
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.cli.connection import client_tls, client_tls_options, resolve_token, token_options
from topo_tune.errors import AgentRefused, EnvPolicyError
from topo_tune.kube.environment import detect_in_cluster
from topo_tune.kube.rack import DEFAULT_RACK_LABEL
from topo_tune.nccl.backends import Backend
from topo_tune.topology.gpu_ranks import MAX_RANKS_PER_GPU
from topo_tune.v1 import topology_pb2

_DIR = click.Path(path_type=Path, file_okay=False)


def _labels(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {value!r}")
        labels[key] = val
    return labels


@click.group()
def agent() -> None:
    """Run the per-node agent daemon."""


@agent.command()
@click.option(
    "--controller",
    "controller_address",
    required=True,
    envvar="TOPO_TUNE_CONTROLLER",
    help="HOST[:PORT] of the controller; the port is 50051 when left out [$TOPO_TUNE_CONTROLLER].",
)
@click.option(
    "--node-name",
    envvar="TOPO_TUNE_NODE_NAME",
    help="Name to register as [$TOPO_TUNE_NODE_NAME, else the host name].",
)
@click.option(
    "--rack",
    envvar="TOPO_TUNE_RACK",
    default="",
    help="Rack, when cluster.yaml does not say [$TOPO_TUNE_RACK].",
)
@click.option(
    "--rack-label",
    envvar="TOPO_TUNE_RACK_LABEL",
    default=DEFAULT_RACK_LABEL,
    show_default=True,
    help="In a Kubernetes pod without --rack: the node label that names the rack; with the default, a node without "
    "it takes the lowest Topograph, EKS or GKE network tier as its rack [$TOPO_TUNE_RACK_LABEL].",
)
@click.option("--label", "labels", multiple=True, callback=_labels, help="KEY=VALUE label; repeatable.")
@click.option(
    "--backend",
    type=click.Choice([b.value for b in Backend]),
    default=Backend.NCCL.value,
    show_default=True,
    help="Benchmark backend: nccl (GPUs), gloo (CPUs over TCP), sim (analytic model, labelled simulated).",
)
@click.option(
    "--address",
    envvar="TOPO_TUNE_ADDRESS",
    default="",
    help="Address peers reach this node at for benchmarks [$TOPO_TUNE_ADDRESS, else the one the controller sees].",
)
@click.option(
    "--sim-profile",
    type=click.Choice(["h100-nvswitch", "h200-nvswitch", "pcie"]),
    default="h100-nvswitch",
    show_default=True,
    help="With --backend sim: the simulated node this agent stands for.",
)
@click.option(
    "--sim-gpus", type=click.IntRange(1, 64), default=8, show_default=True, help="With --backend sim: its GPU count."
)
@click.option(
    "--state-dir",
    type=_DIR,
    default=Path("/var/lib/topo-tune"),
    show_default=True,
    help="Journal of commands and undelivered results; keep it across restarts.",
)
@click.option(
    "--config-dir",
    type=_DIR,
    default=Path("/etc/nccl/topo-tune"),
    show_default=True,
    help="Where staged NCCL configuration versions live.",
)
@click.option(
    "--worker-env",
    "worker_env",
    multiple=True,
    callback=_labels,
    help="KEY=VALUE every benchmark worker gets, over any job's value (e.g. NCCL_NVLS_ENABLE=0); repeatable. "
    "Checked by the same environment policy as a job's variables.",
)
@click.option(
    "--ranks-per-gpu",
    type=click.IntRange(1, MAX_RANKS_PER_GPU),
    default=1,
    show_default=True,
    help="Test and development mode: run this many benchmark ranks on each GPU, so one GPU runs real multi-rank "
    "NCCL (start the CUDA MPS daemon first). Needs --backend nccl and NCCL >= 2.30 where the workers load it; "
    "workers get NCCL_MULTI_RANK_GPU_ENABLE=1 and at most 128/N channels. Its times are one GPU's, not links'.",
)
@click.option(
    "--kept-worker-sets",
    type=click.IntRange(0, 16),
    default=AgentSettings.kept_worker_sets,
    show_default=True,
    help="Benchmark worker processes are kept after a job for later jobs with the same NCCL environment (they "
    "skip process start, torch and CUDA set-up, and keep their communicator for a job of the same ranks and "
    "tuner table): at most this many "
    "idle sets, each ended after 5 minutes idle or when it grew past 4 GiB. 0: fresh workers for every job. "
    "A proof's pairs rotate over the baseline and every finalist: keep at least 1 + search.finalists.",
)
@click.option(
    "--reconnect-max",
    "reconnect_max_s",
    type=click.FloatRange(0.5, 3600),
    envvar="TOPO_TUNE_RECONNECT_MAX",
    default=AgentSettings.backoff_max_s,
    show_default=True,
    help="Seconds: the longest wait between attempts to reach the controller (they start at 0.5 s, double, and are "
    "drawn at random below that cap so a fleet does not reconnect at once) [$TOPO_TUNE_RECONNECT_MAX].",
)
@click.option(
    "--token-grace",
    "token_grace_s",
    type=click.FloatRange(0, 3600),
    envvar="TOPO_TUNE_TOKEN_GRACE",
    default=AgentSettings.token_grace_s,
    show_default=True,
    help="Seconds: how long a token from --token-file that the controller refuses is retried, in case the file is "
    "rewritten (a rotated Kubernetes token); then the agent exits with status 2 [$TOPO_TUNE_TOKEN_GRACE].",
)
@token_options
@client_tls_options
def run(
    controller_address: str,
    node_name: str | None,
    rack: str,
    rack_label: str,
    labels: dict[str, str],
    backend: str,
    address: str,
    sim_profile: str,
    sim_gpus: int,
    state_dir: Path,
    config_dir: Path,
    worker_env: dict[str, str],
    ranks_per_gpu: int,
    kept_worker_sets: int,
    reconnect_max_s: float,
    token_grace_s: float,
    token_file: Path | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Connect to the controller and serve it until SIGTERM or Ctrl-C.

    The agent dials out, registers this node's topology, heartbeats, and runs the commands it is sent.
    When the controller goes away it retries with backoff and keeps its results until they are delivered.
    A refusal that retrying cannot heal (a wrong token, another node's credential, an invalid node name) ends
    it with exit status 2 and one line naming the flag or file to fix.
    """
    try:
        EnvPolicy(config_dirs=(config_dir,)).check(worker_env)
    except EnvPolicyError as exc:
        raise click.BadParameter(str(exc), param_hint="--worker-env") from exc
    if ranks_per_gpu > 1:
        from topo_tune.agent.discovery.discover import libnccl_version  # noqa: PLC0415 - loads libnccl

        why = refusal(ranks_per_gpu, backend=Backend(backend), nccl_version=libnccl_version())
        if why:
            raise click.BadParameter(why, param_hint="--ranks-per-gpu")
    settings = AgentSettings(
        controller=controller_address,
        node_name=node_name or socket.gethostname(),
        token=resolve_token(token_file),
        token_file=token_file.absolute() if token_file else None,
        rack=rack,
        labels=labels,
        backend=Backend(backend),
        address=address,
        sim_profile=sim_profile,
        sim_gpus=sim_gpus,
        # Absolute: benchmark workers run in their job's directory and are handed paths under these.
        state_dir=state_dir.absolute(),
        config_dir=config_dir.absolute(),
        tls=client_tls(tls_ca, tls_cert, tls_key),
        kubernetes=detect_in_cluster(os.environ),
        rack_label=rack_label,
        worker_env=worker_env,
        ranks_per_gpu=ranks_per_gpu,
        kept_worker_sets=kept_worker_sets,
        backoff_max_s=reconnect_max_s,
        token_grace_s=token_grace_s,
    )
    try:
        asyncio.run(_run(settings))
    except AgentRefused as refused:
        # Not the group's exit 1: 2 says "fix the invocation", and a supervisor need not restart it at once.
        from topo_tune.cli.output import emit_line  # noqa: PLC0415 - rich and yaml: only when refused

        emit_line(f"topo-tune: error: {refused}", err=True)
        raise SystemExit(2) from None


async def _run(settings: AgentSettings) -> None:
    from topo_tune.agent.daemon import Agent  # noqa: PLC0415 - keeps the other commands' start-up fast

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if settings.backend.simulated:
        from topo_tune.sim.node_topology import simulated_node_topology  # noqa: PLC0415

        def simulated() -> topology_pb2.NodeTopology:
            return simulated_node_topology(settings.node_name, profile=settings.sim_profile, gpus=settings.sim_gpus)

        await Agent(settings, discover=simulated).run(stop)
    else:
        await Agent(settings).run(stop)
