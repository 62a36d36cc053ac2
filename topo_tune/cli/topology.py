"""``topo-tune topology``: look at this node's topology, or at an NCCL topology file, with no controller.

The first command an operator runs on a new node: it discovers the node (NVML + sysfs) or reads the XML NCCL
wrote with ``NCCL_TOPO_DUMP_FILE``, and prints the `nvidia-smi topo -m`-style matrix with its legend, NUMA and
CPU affinity and what could not be determined; ``--output json|yaml`` prints the full ``NodeTopology``.
``export`` writes the cluster's racks and tiers for Slurm, from cluster.yaml or from a controller.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from topo_tune.agent.discovery import discover
from topo_tune.cli.connection import client_tls, client_tls_options, controller_option, resolve_token, token_options
from topo_tune.cli.output import emit_data, emit_lines
from topo_tune.errors import ConfigError
from topo_tune.topology.distance import PairMatrix
from topo_tune.topology.fingerprint import topology_fingerprint
from topo_tune.topology.matrix import render_node_matrix
from topo_tune.topology.nccl_dump import read_nccl_topology
from topo_tune.topology.nccl_topo_file import nccl_topology_xml, vm_topology_file
from topo_tune.topology.slurm_export import SlurmForm, SwitchTree, render, switch_tree
from topo_tune.tuner.ring.rank_map import HostfileFlavour, plan_rank_map
from topo_tune.wire.plain_data import to_data


@click.group()
def topology() -> None:
    """Show a node's GPU/NIC topology (no controller needed), or export the cluster's for Slurm."""


@topology.command("show")
@click.option(
    "--nccl-xml",
    "nccl_xml",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read this NCCL topology XML (NCCL_TOPO_DUMP_FILE output) instead of discovering this node.",
)
@click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json", "yaml", "nccl-xml"]),
    default="table",
    show_default=True,
    help="json/yaml: the full NodeTopology in plain values; nccl-xml: the node as an NCCL topology file "
    "(a port per <net>).",
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
    if output == "nccl-xml":
        click.echo(nccl_topology_xml(topo), nl=False)
        return
    fingerprint = topology_fingerprint(topo)
    if output in ("json", "yaml"):
        emit_data({"fingerprint": fingerprint, "topology": to_data(topo)}, output)
    else:
        emit_lines(render_node_matrix(topo), nl=False)
        emit_lines(f"\nFingerprint: {fingerprint}")


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
    try:
        text = host_xml.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise click.BadParameter(f"cannot read {host_xml}: {error}", param_hint="--host-xml") from error
    host = read_nccl_topology(text, source=host_xml.name)
    try:
        click.echo(vm_topology_file(host, bus_ids=_bus_map(pairs)), nl=False)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--map") from error


def _tiers(data: dict[str, object]) -> dict[str, tuple[str, ...]] | None:
    tiers = data.get("tiers")
    if tiers is None:
        return None
    if not isinstance(tiers, dict) or not all(
        isinstance(t, list) and all(isinstance(v, str) and v for v in t) for t in tiers.values()
    ):
        raise click.BadParameter('"tiers" must map each node to a list of tier names', param_hint="PAIRS_FILE")
    return {str(node): tuple(t) for node, t in tiers.items()}


@topology.command("ring")
@click.argument("pairs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--output",
    type=click.Choice(["json", "mpi", "slurm", "torchrun"]),
    default="json",
    show_default=True,
    help="json: the rank map; mpi/slurm/torchrun: a hostfile in ring order.",
)
def ring(pairs_file: Path, output: str) -> None:
    """Order nodes into the best NCCL ring from a node-pair file.

    \b
    PAIRS_FILE is JSON: {"nodes": [...], "bandwidth_gbps": [[GB/s]], "latency_us": [[µs]] (optional),
                         "racks": {"node": "rack"} (optional),
                         "tiers": {"node": ["spine", "block"]} (optional: above the rack, top first),
                         "slots": 8 or {"node": 8}}
    The rank map and hostfiles give the predicted ring bottleneck next to the file's own node order; the ring
    crosses each tier (a spine block) as few times as its bottleneck allows, then each rack.
    """
    try:
        data = json.loads(pairs_file.read_text())
    except (OSError, ValueError) as error:
        raise click.BadParameter(f"cannot read {pairs_file}: {error}", param_hint="PAIRS_FILE") from error
    if not isinstance(data, dict):
        raise click.BadParameter("expected a JSON object", param_hint="PAIRS_FILE")
    unknown = sorted(set(data) - {"nodes", "bandwidth_gbps", "latency_us", "racks", "tiers", "slots"})
    if unknown:
        raise click.BadParameter(f"unknown key(s): {', '.join(unknown)}", param_hint="PAIRS_FILE")
    for key in ("nodes", "bandwidth_gbps"):
        if key not in data:
            raise click.BadParameter(f"missing key {key!r}", param_hint="PAIRS_FILE")
    try:
        pairs = PairMatrix.from_matrices(
            data["nodes"], data["bandwidth_gbps"], data.get("latency_us"), method=f"file {pairs_file.name}"
        )
        plan = plan_rank_map(pairs, slots=data.get("slots", 1), rack_of=data.get("racks"), tiers_of=_tiers(data))
    except (TypeError, ValueError) as error:
        raise click.BadParameter(str(error), param_hint="PAIRS_FILE") from error
    flavours: dict[str, HostfileFlavour] = {"mpi": "mpi", "slurm": "slurm", "torchrun": "torchrun"}
    click.echo(plan.to_json() if output == "json" else plan.hostfile(flavours[output]), nl=False)


_FORMS: dict[str, SlurmForm] = {"slurm-tree": "tree", "slurm-block": "block", "slurm-yaml": "yaml"}


@topology.command("export")
@click.option(
    "--format",
    "form",
    type=click.Choice(list(_FORMS)),
    required=True,
    help="slurm-tree: topology.conf for topology/tree (any Slurm); slurm-block: topology.conf for "
    "topology/block (Slurm 23.11+); slurm-yaml: topology.yaml with both (Slurm 25.05+).",
)
@click.option(
    "--cluster-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Take racks and tiers from this cluster.yaml (no controller, no bandwidths) instead of the controller.",
)
@controller_option
@token_options
@client_tls_options
def export(
    form: str,
    cluster_config: Path | None,
    address: str,
    token_file: Path | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Print the cluster's racks and network tiers as Slurm topology, so Slurm packs jobs where links are fast.

    \b
    Each rack is a leaf switch (a block for slurm-block), each tier above it (the nodes' tier labels, e.g.
    network.topology.nvidia.com/spine) a switch above; a root joins several top switches. From a controller,
    each switch gets the slowest measured node pair crossing it (probe rounds, GB/s) as a comment.
    \b
      topo-tune topology export --format slurm-tree --controller HOST:PORT > /etc/slurm/topology.conf
      topo-tune topology export --format slurm-tree --cluster-config cluster.yaml
    slurm.conf: TopologyPlugin=topology/tree (or topology/block); topology.yaml needs no plugin line and
    makes Slurm ignore topology.conf. docs/slurm.md.
    """
    from topo_tune.kube.rack import tiers_above  # noqa: PLC0415 - the Kubernetes label schemes, only here

    if cluster_config is not None:
        from topo_tune.config.cluster import load_cluster_config  # noqa: PLC0415 - pydantic, only here

        config = load_cluster_config(cluster_config)
        labels = {node.name: node.labels for rack in config.racks for node in rack.nodes}
        tree = _tree(config.rack_of(), {n: tiers_above(v) for n, v in labels.items()}, [], hint="--cluster-config")
        source = cluster_config.name
    else:
        from topo_tune.client.admin import AdminClient  # noqa: PLC0415 - gRPC, only with a controller

        with AdminClient(address, token=resolve_token(token_file), tls=client_tls(tls_ca, tls_cert, tls_key)) as client:
            view = client.cluster_topology()
            measured = client.measured_pairs()
        rack_of: dict[str, str] = {n.name: n.rack for n in view.nodes}
        tiers: dict[str, tuple[str, ...]] = {n.name: tiers_above(n.labels) for n in view.nodes}
        pairs = [(m.node_a, m.node_b, m.bandwidth_gbps) for m in measured]
        tree = _tree(rack_of, tiers, pairs, hint="the controller's nodes")
        source = f"the controller at {address}"
    click.echo(render(tree, _FORMS[form], source=source), nl=False)


def _tree(
    rack_of: dict[str, str], tiers: dict[str, tuple[str, ...]], pairs: list[tuple[str, str, float]], *, hint: str
) -> SwitchTree:
    try:
        return switch_tree(rack_of, tiers, pairs)
    except ConfigError as error:
        raise click.ClickException(f"{hint}: {error}") from None
