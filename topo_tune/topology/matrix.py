"""The `nvidia-smi topo -m`-style view of one node: GPU/NIC matrix, legend, affinities and unknowns.

Purpose: the table an operator reads first (``topo-tune topology show``, ``admin topology NODE``), built from a
`NodeTopology` only; also the parsed cell grid, so tests compare against published `nvidia-smi topo -m` output
cell by cell. Non-goals: deciding links (discovery / NCCL XML import do that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topo_tune.topology.levels import LEGEND, link_label
from topo_tune.topology.pci import parse_pci_path, pcie_level
from topo_tune.v1 import topology_pb2

NA = "N/A"
UNKNOWN = "?"


@dataclass(frozen=True)
class NodeMatrix:
    """The matrix as rows of labels: ``cells[row][col]`` over ``names`` (GPUs then NICs)."""

    names: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str, ...]  # per GPU row
    numa_affinity: tuple[str, ...]  # per GPU row
    nic_legend: tuple[tuple[str, str], ...]

    def cell(self, row: str, col: str) -> str:
        return self.cells[self.names.index(row)][self.names.index(col)]


def node_matrix(topo: topology_pb2.NodeTopology) -> NodeMatrix:
    """Lay out the GPU and NIC links of ``topo`` the way `nvidia-smi topo -m` does."""
    gpus = sorted(topo.gpus, key=lambda g: g.index)
    nics = list(topo.nics)
    names = [f"GPU{g.index}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    size = len(names)
    grid = [[UNKNOWN] * size for _ in range(size)]
    for i in range(size):
        grid[i][i] = "X"
    pos = {g.index: i for i, g in enumerate(gpus)}
    for link in topo.gpu_links:
        if link.gpu_a in pos and link.gpu_b in pos:
            label = link_label(link.kind, link.nvlink_count if link.HasField("nvlink_count") else None)
            a, b = pos[link.gpu_a], pos[link.gpu_b]
            grid[a][b] = grid[b][a] = label
    nic_pos = {nic.name: len(gpus) + i for i, nic in enumerate(nics)}
    for aff in topo.nic_affinities:
        if aff.nic in nic_pos and aff.gpu in pos:
            a, b = pos[aff.gpu], nic_pos[aff.nic]
            grid[a][b] = grid[b][a] = link_label(aff.kind)
    _nic_to_nic(topo, nics, nic_pos, grid)
    cpu = tuple(g.cpu_affinity or UNKNOWN for g in gpus)
    numa = tuple(str(g.numa_node) if g.HasField("numa_node") else NA for g in gpus)
    return NodeMatrix(
        names=tuple(names),
        cells=tuple(tuple(row) for row in grid),
        cpu_affinity=cpu,
        numa_affinity=numa,
        nic_legend=tuple((f"NIC{i}", nic.name) for i, nic in enumerate(nics)),
    )


def _nic_to_nic(
    topo: topology_pb2.NodeTopology,
    nics: list[topology_pb2.Nic],
    nic_pos: dict[str, int],
    grid: list[list[str]],
) -> None:
    # NIC pairs use the same PCI rule as GPU↔NIC; computed here because the wire format stores only GPU↔NIC.
    for i, a in enumerate(nics):
        for b in nics[i + 1 :]:
            kind = pcie_level(
                parse_pci_path(a.pci_path),
                parse_pci_path(b.pci_path),
                numa_a=a.numa_node if a.HasField("numa_node") else None,
                numa_b=b.numa_node if b.HasField("numa_node") else None,
            )
            x, y = nic_pos[a.name], nic_pos[b.name]
            grid[x][y] = grid[y][x] = link_label(kind)


def render_node_matrix(topo: topology_pb2.NodeTopology) -> str:
    """The full text view: matrix, legend, NIC legend and what discovery could not determine."""
    m = node_matrix(topo)
    n_gpus = len(m.cpu_affinity)
    header = ["", *m.names, "CPU Affinity", "NUMA Affinity"]
    rows = [header]
    for i, name in enumerate(m.names):
        extra = [m.cpu_affinity[i], m.numa_affinity[i]] if i < n_gpus else ["", ""]
        rows.append([name, *m.cells[i], *extra])
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = [f"Node {topo.hostname or '(unnamed)'}" + (f"  [{topo.source}]" if topo.source else "")]
    if not m.names:
        lines.append("(no GPUs or NICs found)")
    else:
        lines.extend("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip() for row in rows)
    lines.append("")
    lines.append("Legend:")
    lines.extend(f"  {key:<4} = {text}" for key, text in LEGEND)
    if m.nic_legend:
        lines.append("")
        lines.append("NIC Legend:")
        lines.extend(f"  {key}: {name}" for key, name in m.nic_legend)
    lines.append("")
    if topo.excluded_nics:
        lines.append("Left out (NCCL would not use them):")
        lines.extend(f"  - {nic.name}: {nic.reason}" for nic in topo.excluded_nics)
        lines.append("")
    if topo.unknowns:
        lines.append("Unknown (discovery could not tell):")
        lines.extend(f"  - {item}" for item in topo.unknowns)
    else:
        lines.append("Unknown: nothing")
    return "\n".join(lines) + "\n"


def parse_topo_m(text: str) -> NodeMatrix:
    """Parse `nvidia-smi topo -m` output (tabs or spaces) into a `NodeMatrix`; NIC names from its NIC Legend.

    Raises ValueError naming the line when a row has the wrong number of cells.
    """
    lines = [line.rstrip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.split() and line.split()[0].startswith("GPU0"))
    header = lines[start].split()
    names = [h for h in header if re.match(r"^(GPU\d+|NIC\d+|mlx\d+_\d+)$", h)]
    n = len(names)
    cells: list[tuple[str, ...]] = []
    cpu: list[str] = []
    numa: list[str] = []
    for offset, line in enumerate(lines[start + 1 : start + 1 + n], start=start + 2):
        parts = line.split()
        if len(parts) < n + 1 or parts[0] != names[len(cells)]:
            raise ValueError(f"line {offset}: expected a row for {names[len(cells)]}: {line!r}")
        cells.append(tuple(parts[1 : n + 1]))
        if parts[0].startswith("GPU"):
            cpu.append(parts[n + 1] if len(parts) > n + 1 else "")
            numa.append(parts[n + 2] if len(parts) > n + 2 else "")
    legend: list[tuple[str, str]] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("NIC") and ":" in stripped and not stripped.startswith("NIC Legend"):
            key, _, value = stripped.partition(":")
            legend.append((key.strip(), value.strip()))
    return NodeMatrix(
        names=tuple(names),
        cells=tuple(cells),
        cpu_affinity=tuple(cpu),
        numa_affinity=tuple(numa),
        nic_legend=tuple(legend),
    )
