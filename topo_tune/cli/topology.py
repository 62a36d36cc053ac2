"""``topo-tune topology``: look at this node's topology, or at an NCCL topology file, with no controller.

The first command an operator runs on a new node: it discovers the node (NVML + sysfs) or reads the XML NCCL
wrote with ``NCCL_TOPO_DUMP_FILE``, and prints the `nvidia-smi topo -m`-style matrix with its legend, NUMA and
CPU affinity and what could not be determined; ``--output json`` prints the full ``NodeTopology``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from topo_tune.agent.discovery import discover
from topo_tune.topology.cluster import node_to_dict
from topo_tune.topology.fingerprint import topology_fingerprint
from topo_tune.topology.matrix import render_node_matrix
from topo_tune.topology.nccl_xml import read_nccl_topology, vm_topology_file


@click.group()
def topology() -> None:
    """Show a node's GPU/NIC topology (no controller needed)."""


@topology.command("show")
@click.option(
    "--nccl-xml",
    "nccl_xml",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read this NCCL topology XML (NCCL_TOPO_DUMP_FILE output) instead of discovering this node.",
)
@click.option(
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="json: the full NodeTopology.",
)
def show(nccl_xml: Path | None, output: str) -> None:
    """Print this node's topology like `nvidia-smi topo -m`, with the unknowns."""
    if nccl_xml is not None:
        try:
            text = nccl_xml.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise click.BadParameter(f"cannot read {nccl_xml}: {error}", param_hint="--nccl-xml") from error
        topo = read_nccl_topology(text, source=nccl_xml.name)
    else:
        topo = discover()
    fingerprint = topology_fingerprint(topo)
    if output == "json":
        click.echo(json.dumps({"fingerprint": fingerprint, "topology": node_to_dict(topo)}, indent=2))
    else:
        click.echo(render_node_matrix(topo), nl=False)
        click.echo(f"\nFingerprint: {fingerprint}")


def _bus_map(pairs: tuple[str, ...]) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for pair in pairs:
        host, sep, vm = pair.partition("=")
        if not sep or not host or not vm:
            raise click.BadParameter(f"expected HOST_BUS_ID=VM_BUS_ID, got {pair!r}", param_hint="--map")
        mapping[host.strip()] = vm.strip()
    return mapping


@topology.command("vm-file")
@click.option(
    "--host-xml",
    "host_xml",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="NCCL_TOPO_DUMP_FILE output of the bare-metal host (or of an identical one).",
)
@click.option(
    "--map",
    "pairs",
    multiple=True,
    required=True,
    metavar="HOST_BUS_ID=VM_BUS_ID",
    help="Where each passed-through GPU/NIC appears inside the VM (repeat per device).",
)
def vm_file(host_xml: Path, pairs: tuple[str, ...]) -> None:
    """Print an NCCL_TOPO_FILE giving a VM the host's PCI tree under the VM's bus ids."""
    host = read_nccl_topology(host_xml.read_text(), source=host_xml.name)
    try:
        click.echo(vm_topology_file(host, bus_ids=_bus_map(pairs)), nl=False)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--map") from error
