"""``topo-tune admin``: talk to a running controller."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from topo_tune.cli.connection import (
    client_tls,
    client_tls_options,
    controller_option,
    resolve_token,
    token_options,
)
from topo_tune.cli.field_flags import naming_flags
from topo_tune.cli.output import FORMATS, emit_data, emit_lines, emit_table
from topo_tune.client.admin import AdminClient
from topo_tune.command_record import CommandInfo, NodeCommand
from topo_tune.ids import NodeName
from topo_tune.v1 import topology_pb2
from topo_tune.wire.commands import command_data
from topo_tune.wire.nodes import node_data
from topo_tune.wire.plain_data import to_data

F = TypeVar("F", bound=Callable[..., Any])


def connected(function: F) -> F:
    """Add --controller/--output/token/TLS options and pass an open ``AdminClient`` as ``client``; a refused
    request's fields are named as the command's flags (``field_flags``)."""

    @controller_option
    @click.option("--output", "-o", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
    @token_options
    @client_tls_options
    @functools.wraps(function)
    def wrapper(
        address: str,
        fmt: str,
        token_file: Path | None,
        tls_ca: Path | None,
        tls_cert: Path | None,
        tls_key: Path | None,
        **kwargs: Any,
    ) -> Any:
        tls = client_tls(tls_ca, tls_cert, tls_key)
        token = resolve_token(token_file)
        with naming_flags(click.get_current_context()), AdminClient(address, token=token, tls=tls) as client:
            return function(client=client, fmt=fmt, **kwargs)

    return wrapper  # type: ignore[return-value]


def _age(at: datetime | None) -> str:
    if at is None or at.timestamp() < 1:  # never heard from (an unset instant reads as the epoch)
        return "-"
    seconds = (datetime.now(UTC) - at).total_seconds()
    if seconds < 120:
        return f"{max(0.0, seconds):.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.0f}h ago"


@click.group()
def admin() -> None:
    """Query and command a running controller.

    Every sub-command takes --controller HOST:PORT (or $TOPO_TUNE_CONTROLLER), the token
    (--token-file or $TOPO_TUNE_TOKEN) and --output table|json|yaml.
    """


@admin.command()
@click.option("--rack", default="", help="Only this rack.")
@connected
def nodes(client: AdminClient, fmt: str, rack: str) -> None:
    """List registered nodes with their state, rack and last heartbeat."""
    found = client.list_nodes(rack=rack)
    if fmt != "table":
        emit_data([node_data(n) for n in found], fmt)
        return
    rows = [
        (
            n.name,
            n.rack or "-",
            n.state.value,
            n.activity or "?",
            n.backend or "?",
            (n.applied_config_version or "-") + (" DAMAGED" if n.config_damage else ""),
            _age(n.last_heartbeat_at),
        )
        for n in found
    ]
    emit_table(f"{len(found)} nodes", ("NAME", "RACK", "STATE", "ACTIVITY", "BACKEND", "CONFIG", "HEARTBEAT"), rows)
    failing = [(n.name, n.config_apply_error) for n in found if n.config_apply_error]
    if failing:
        emit_table("last config apply failed", ("NAME", "REASON"), failing)


@admin.command()
@click.argument("name")
@connected
def node(client: AdminClient, fmt: str, name: str) -> None:
    """Show one node, with its discovered topology."""
    found = client.get_node(NodeName(name))
    if fmt != "table":
        emit_data(node_data(found), fmt)
        return
    topo = found.topology if found.topology is not None else topology_pb2.NodeTopology()  # none reported
    lines = [
        ("name", found.name),
        ("rack", found.rack or "-"),
        ("state", found.state.value),
        ("activity", found.activity or "?"),
        ("drained", "yes" if found.drained else "no"),
        ("backend", found.backend or "?"),
        ("agent", found.agent_version),
        ("registrations", str(found.registrations)),
        ("last heartbeat", _age(found.last_heartbeat_at)),
        ("config version", found.applied_config_version or "-"),
        ("config damage", found.config_damage or "-"),
        ("config apply error", found.config_apply_error or "-"),
        ("host", f"{topo.hostname}, {topo.cpu_count} CPUs, {topo.memory_bytes / 2**30:.1f} GiB"),
        ("GPUs", ", ".join(f"{g.index}:{g.name}" for g in topo.gpus) or "none"),
        ("NICs", ", ".join(n.name for n in topo.nics) or "none"),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(found.labels.items())) or "-"),
        ("unknown", "; ".join(topo.unknowns) or "-"),
    ]
    emit_table(f"node {found.name}", ("FIELD", "VALUE"), lines)


def _print_command(info: CommandInfo, fmt: str) -> None:
    if fmt != "table":
        emit_data(command_data(info), fmt)
        return
    emit_table(
        f"command {info.command_id}",
        ("FIELD", "VALUE"),
        [
            ("node", info.node_name),
            ("kind", info.kind),
            ("status", info.status.value),
            ("deliveries", str(info.deliveries)),
            ("message", info.message or "-"),
        ],
    )


def _send(client: AdminClient, fmt: str, *, node_name: str, command: NodeCommand, command_id: str) -> None:
    _print_command(client.send_command(NodeName(node_name), command, command_id=command_id), fmt)


_COMMAND_ID = click.option("--id", "command_id", default="", help="Your own command id, for idempotent retries.")


@admin.command()
@click.argument("node_names", metavar="NODE...", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every node the controller knows, in one fan-out.")
@click.option(
    "--id",
    "command_id",
    default="",
    help="Your own command id, for idempotent retries (with several nodes: a prefix, ids become ID-NODE).",
)
@connected
def rediscover(client: AdminClient, fmt: str, node_names: tuple[str, ...], every: bool, command_id: str) -> None:
    """Ask the agents of NODE... (or --all) to discover their topology again (delivered when each next connects).

    Several nodes go out as one fan-out: stored together in one transaction, then sent concurrently."""
    if every == bool(node_names):
        raise click.UsageError("give NODE... or --all")
    if len(node_names) == 1:
        _send(client, fmt, node_name=node_names[0], command=NodeCommand.REDISCOVER, command_id=command_id)
        return
    targets = [NodeName(name) for name in node_names]
    sent = client.send_commands(targets, NodeCommand.REDISCOVER, command_id_prefix=command_id)
    if fmt != "table":
        emit_data([command_data(c) for c in sent], fmt)
        return
    rows = [(c.command_id, c.node_name, c.status.value, str(c.deliveries)) for c in sent]
    emit_table(f"{len(rows)} commands", ("ID", "NODE", "STATUS", "DELIVERIES"), rows)


@admin.command()
@click.argument("node_name", metavar="NODE")
@_COMMAND_ID
@connected
def drain(client: AdminClient, fmt: str, node_name: str, command_id: str) -> None:
    """Stop NODE from taking benchmark jobs."""
    _send(client, fmt, node_name=node_name, command=NodeCommand.DRAIN, command_id=command_id)


@admin.command()
@click.argument("node_name", metavar="NODE")
@_COMMAND_ID
@connected
def undrain(client: AdminClient, fmt: str, node_name: str, command_id: str) -> None:
    """Let NODE take benchmark jobs again."""
    _send(client, fmt, node_name=node_name, command=NodeCommand.UNDRAIN, command_id=command_id)


@admin.command()
@click.option("--node", "node_name", default="", help="Only this node's commands.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@connected
def commands(client: AdminClient, fmt: str, node_name: str, limit: int) -> None:
    """List recent commands, newest first."""
    found = client.list_commands(node_name=node_name, limit=limit)
    if fmt != "table":
        emit_data([command_data(c) for c in found], fmt)
        return
    rows = [
        (
            c.command_id,
            c.node_name,
            c.kind,
            c.status.value,
            str(c.deliveries),
            c.message or "-",
        )
        for c in found
    ]
    emit_table(f"{len(found)} commands", ("ID", "NODE", "KIND", "STATUS", "DELIVERIES", "MESSAGE"), rows)


@admin.command()
@click.argument("command_id", metavar="ID")
@connected
def command(client: AdminClient, fmt: str, command_id: str) -> None:
    """Show one command and its result."""
    _print_command(client.get_command(command_id), fmt)


@admin.command()
@click.argument("node_name", metavar="[NODE]", required=False)
@connected
def topology(client: AdminClient, fmt: str, node_name: str | None) -> None:
    """Show the cluster as racks, or NODE's GPU/NIC matrix (like `nvidia-smi topo -m`).

    Without NODE: every rack with its nodes, GPUs, NICs and topology fingerprints. With NODE: that node's
    matrix with its legend, NUMA and CPU affinity, and what discovery could not tell.
    """
    # Imported here: the topology model pulls in numpy, which the other admin commands do not need.
    from topo_tune.kube.rack import tiers_above  # noqa: PLC0415
    from topo_tune.topology import Spine, build_cluster, render_admin_topology  # noqa: PLC0415
    from topo_tune.topology.cluster import admin_topology_data  # noqa: PLC0415

    view = client.cluster_topology()
    spine = None
    if view.spine_oversubscription is not None or view.spine_bandwidth_gbps is not None:
        spine = Spine(
            oversubscription=1.0 if view.spine_oversubscription is None else view.spine_oversubscription,
            bandwidth_gbps=view.spine_bandwidth_gbps,
        )
    # A node whose agent reported no topology is modelled with nothing discovered.
    empty = topology_pb2.NodeTopology()
    topologies: dict[str, topology_pb2.NodeTopology] = {
        n.name: n.topology if n.topology is not None else empty for n in view.nodes
    }
    tiers: dict[str, tuple[str, ...]] = {n.name: tiers_above(n.labels) for n in view.nodes}
    cluster = build_cluster(topologies, {n.name: n.rack for n in view.nodes if n.rack}, spine=spine, tiers_of=tiers)
    if fmt != "table":
        emit_data(admin_topology_data(cluster, node=node_name, node_data=to_data), fmt)
        return
    emit_lines(render_admin_topology(cluster, node=node_name), nl=False)
