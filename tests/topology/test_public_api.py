from __future__ import annotations

from topo_tune import topology


def test_the_curated_public_api_is_complete_and_sorted() -> None:
    assert topology.__all__ == sorted(topology.__all__)
    missing = [name for name in topology.__all__ if not hasattr(topology, name)]
    assert missing == []
    # What other packages need from the model is reachable from the package itself.
    for name in (
        "build_cluster",
        "render_admin_topology",
        "render_node_matrix",
        "read_nccl_topology",
        "vm_topology_file",
        "topology_fingerprint",
        "gpu_pair_matrix",
        "Measurement",
    ):
        assert name in topology.__all__
