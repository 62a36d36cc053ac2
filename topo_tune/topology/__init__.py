"""The topology model shared by agent, controller and tuner (no gRPC here; protobuf messages only).

- `matrix`: the `nvidia-smi topo -m`-style node view; `levels`: the link vocabulary.
- `nccl_xml`: NCCL topology XML's element tree; `nccl_dump` reads ``NCCL_TOPO_DUMP_FILE``, `nccl_topo_file`
  writes ``NCCL_TOPO_FILE`` (for VMs).
- `fingerprint`: stable hashes of node and cluster topology.
- `distance`: the distance/bandwidth model with measured overrides.
- `cluster`: racks, spine and the ``admin topology`` views.
"""

from topo_tune.errors import ClusterModelError, NcclXmlError
from topo_tune.topology.cluster import (
    ClusterTopology,
    Rack,
    Spine,
    build_cluster,
    racks_from_labels,
    render_admin_topology,
    render_cluster,
)
from topo_tune.topology.distance import (
    DistanceWeights,
    Measurement,
    PairEstimate,
    PairMatrix,
    gpu_pair_matrix,
    node_pair_matrix,
)
from topo_tune.topology.fingerprint import cluster_fingerprint, topology_fingerprint
from topo_tune.topology.matrix import node_matrix, render_node_matrix
from topo_tune.topology.nccl_dump import read_nccl_topology
from topo_tune.topology.nccl_topo_file import vm_topology_file
from topo_tune.topology.nccl_xml import render_xml

__all__ = [
    "ClusterModelError",
    "ClusterTopology",
    "DistanceWeights",
    "Measurement",
    "NcclXmlError",
    "PairEstimate",
    "PairMatrix",
    "Rack",
    "Spine",
    "build_cluster",
    "cluster_fingerprint",
    "gpu_pair_matrix",
    "node_matrix",
    "node_pair_matrix",
    "racks_from_labels",
    "read_nccl_topology",
    "render_admin_topology",
    "render_cluster",
    "render_node_matrix",
    "render_xml",
    "topology_fingerprint",
    "vm_topology_file",
]
