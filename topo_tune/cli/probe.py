"""``topo-tune admin probe``: measure node-to-node bandwidth and latency for every pair."""

from __future__ import annotations

import click

from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound, ProbeStatus
from topo_tune.cli.admin import admin, connected
from topo_tune.cli.bench import ByteSize
from topo_tune.cli.output import emit_data, emit_line, emit_table
from topo_tune.cli.progress import progress_lines
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ControllerError
from topo_tune.wire.admin_jobs import pair_data, probe_round_data


def _pairs_table(title: str, pairs: list[PairMeasurement]) -> None:
    rows = [(p.node_a, p.node_b, f"{p.bandwidth_gbps:.3f}", f"{p.latency_us:.1f}", p.method) for p in pairs]
    emit_table(title, ("NODE A", "NODE B", "BANDWIDTH (GB/s)", "LATENCY (us)", "METHOD"), rows)


def _print_round(found: ProbeRound, fmt: str) -> None:
    if fmt != "table":
        emit_data(probe_round_data(found), fmt)
        return
    status = found.status.value
    _pairs_table(
        f"probe round {found.round_id}: {status}, {len(found.measurements)}/{found.pairs_total} pairs in "
        f"{found.rounds} rounds",
        list(found.measurements),
    )
    if found.message:
        emit_line(f"# {found.message}")
    if found.sampling == "sparse":
        emit_line("# sparse sample: the pairs not listed are inferred from the rack model")
        for label, items in (
            ("slow NICs (slow with every peer)", list(found.degraded_nodes)),
            ("slow rack uplinks (slow with every other rack)", list(found.degraded_uplinks)),
            ("single slow pairs (a cable or port)", [f"{a}-{b}" for a, b in found.slow_pairs]),
        ):
            emit_line(f"# {label}: {', '.join(items) if items else 'none'}")


@admin.group()
def probe() -> None:
    """Pairwise node-to-node probes; measured pairs replace modelled ones in the topology model."""


@probe.command("run")
@click.option("--nodes", default="", help="Comma-separated node names [every ready node].")
@click.option("--size", "message_bytes", type=ByteSize(), default="16M", show_default=True, help="Bandwidth size.")
@click.option("--pair-deadline", type=click.IntRange(1, 3600), default=120, show_default=True, help="Seconds.")
@click.option(
    "--sampling",
    type=click.Choice(["auto", "full", "sparse"]),
    default="auto",
    show_default=True,
    help="full: every pair; sparse: rack rings, samples between racks, escalation around slow pairs, the rest "
    "inferred; auto: sparse above 64 nodes.",
)
@click.option("--wait/--no-wait", default=True, show_default=True)
@connected
def run(
    client: AdminClient, fmt: str, nodes: str, message_bytes: int, pair_deadline: int, sampling: str, wait: bool
) -> None:
    """Probe the pairs of NODES in rounds of disjoint pairs: every pair (n nodes: about n rounds), or a sparse
    sample that finds slow NICs, rack uplinks and cables in far fewer rounds."""
    request = ProbeRequest(
        nodes=tuple(n.strip() for n in nodes.split(",") if n.strip()),
        message_bytes=message_bytes,
        pair_deadline_s=pair_deadline,
        sampling="" if sampling == "auto" else sampling,
    )
    found = client.start_probe_round(request)
    if wait:
        if found.sampling == "sparse":
            emit_line(f"# probe round {found.round_id}: sparse sample, planned batch by batch ...", err=True)
        else:
            emit_line(
                f"# probe round {found.round_id}: {found.pairs_total} pairs in {found.rounds} rounds ...", err=True
            )
        if found.status is ProbeStatus.RUNNING:
            found = client.watch_probe_round(
                found.round_id,
                progress_lines("pairs measured", lambda found: found.status is ProbeStatus.RUNNING),
            )
    _print_round(found, fmt)
    if found.status is ProbeStatus.FAILED:
        raise ControllerError(f"probe round {found.round_id} failed: {found.message}")


@probe.command()
@click.argument("round_id", metavar="ID")
@connected
def show(client: AdminClient, fmt: str, round_id: str) -> None:
    """Show a probe round and what it measured."""
    _print_round(client.get_probe_round(round_id), fmt)


@probe.command()
@connected
def pairs(client: AdminClient, fmt: str) -> None:
    """The newest measurement of every pair ever probed."""
    found = client.measured_pairs()
    if fmt != "table":
        emit_data([pair_data(p) for p in found], fmt)
        return
    _pairs_table(f"{len(found)} measured pairs", found)
