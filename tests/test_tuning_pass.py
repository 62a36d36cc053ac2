"""The pass's study plan: a resumed study searches the rank orders it started with; the pair matrix and the ring
planned on it, from the nodes' registered racks, tiers and probes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound, ProbeStatus
from topo_tune.config.cluster import ClusterConfig, parse_cluster_config
from topo_tune.node_record import NodeInfo, NodeInventory, NodeState
from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.objective import Measurements, SizeSample
from topo_tune.tuner.ring.rank_map import plan_rank_map
from topo_tune.tuner.space import TrialConfig
from topo_tune.tuner.study import MeasurementRequest, run_study
from topo_tune.tuning_pass.run import StudyPlan, _pair_matrix, check_ring, network_tiers, plan_study
from topo_tune.v1 import topology_pb2

NODES = ("node-1", "node-2", "node-3", "node-4")


def flat(config: TrialConfig, request: MeasurementRequest) -> Measurements:
    return Measurements(
        tuple(SizeSample(c, s, 10.0 + s / 1e4, s / 1e4) for c in request.collectives for s in request.sizes)
    )


def plan(storage: str, best_ring: tuple[str, ...]) -> StudyPlan:
    """The plan over a pair matrix where ``best_ring``'s hops are a hair faster than the diagonals (probe noise)."""
    cluster = parse_cluster_config(
        {
            "apiVersion": "topo-tune/v1",
            "kind": "Cluster",
            "metadata": {"name": "resume"},
            "backend": "gloo",
            "racks": [{"name": "rack-a", "nodes": [{"name": n, "gpus": 1} for n in NODES]}],
            "search": {"budget": 3, "finalists": 0, "minBytes": "1M", "maxBytes": "1M", "tunerTable": False},
        }
    )
    hops = {frozenset(p) for p in zip(best_ring, best_ring[1:] + best_ring[:1], strict=True)}
    bandwidth = [[0.0 if a == b else 10.0 if frozenset((a, b)) in hops else 9.9 for b in NODES] for a in NODES]
    return plan_study(
        cluster,
        names=NODES,
        pairs=PairMatrix.from_matrices(NODES, bandwidth, method="test"),
        topologies={n: topology_pb2.NodeTopology() for n in NODES},
        slots=dict.fromkeys(NODES, 1),
        name="init/resume",
        storage=storage,
    )


def test_a_resumed_study_keeps_its_rank_orders_though_the_re_probed_pairs_moved(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    moved = ("node-1", "node-3", "node-2", "node-4")
    first = plan(storage, NODES)
    fresh = plan(f"sqlite:///{tmp_path / 'other.db'}", moved)
    assert fresh.space.rank_orders != first.space.rank_orders, "a new study plans its orders from the pairs"
    outcome = run_study(first.settings, space=first.space, objective=first.objective, evaluate=flat)
    assert len(outcome.trials) == 3
    # The same command again: its probe finds another ring a hair faster.
    again = plan(storage, moved)
    resumed = run_study(again.settings, space=again.space, objective=again.objective, evaluate=flat)
    assert [t.number for t in resumed.trials] == [0, 1, 2], "the same study, resumed"
    assert again.space.rank_orders == first.space.rank_orders and again.candidates == first.candidates


def test_nvlink_multicast_kept_off_in_every_nodes_workers_is_not_searched() -> None:
    # Both nodes on NVSwitch: NCCL_NVLS_ENABLE is a dimension, unless workerEnv pins it off on every node (where
    # the worker's value wins over any trial's, so searching it would measure one setting twice).
    switched = topology_pb2.NodeTopology(gpu_links=[topology_pb2.GpuLink(gpu_a=0, gpu_b=1, via_nvswitch=True)])

    def space_of(*envs: dict[str, str]) -> frozenset[str]:
        nodes = [{"name": f"n{i}", "workerEnv": env} for i, env in enumerate(envs)]
        cluster = parse_cluster_config(
            {"apiVersion": "topo-tune/v1", "backend": "nccl", "racks": [{"name": "r", "nodes": nodes}]}
        )
        names = [n["name"] for n in nodes]
        built = plan_study(
            cluster,
            names=names,
            pairs=PairMatrix.from_matrices(names, [[0.0, 1.0], [1.0, 0.0]], method="test"),
            topologies=dict.fromkeys(names, switched),
            slots=dict.fromkeys(names, 2),
            name="init/nvls",
            storage="sqlite://",
        )
        return frozenset(d.name for d in built.space.dimensions)

    off = {"NCCL_NVLS_ENABLE": "0"}
    assert "nvls" in space_of({}, {})
    assert "nvls" in space_of(off, {}), "one node with NVLS left on: still a choice there"
    assert "nvls" not in space_of(off, off)


def _two_racks_sampled() -> tuple[ClusterConfig, list[str], list[tuple[str, str, float]]]:
    """Two racks of four with probeSampling sparse, and a measured ring (11 GB/s) through each rack."""
    racks = {"a": ["a1", "a2", "a3", "a4"], "b": ["b1", "b2", "b3", "b4"]}
    cluster = parse_cluster_config(
        {
            "apiVersion": "topo-tune/v1",
            "kind": "Cluster",
            "metadata": {"name": "sparse"},
            "backend": "gloo",
            "racks": [{"name": r, "nodes": [{"name": n, "gpus": 1} for n in nodes]} for r, nodes in racks.items()],
            "search": {"probeSampling": "sparse"},
        }
    )
    ring = [(nodes[i], nodes[(i + 1) % 4], 11.0) for nodes in racks.values() for i in range(4)]
    return cluster, racks["a"] + racks["b"], ring


class _Probed:
    """The admin API as the pass reads the matrix: topologies and the measured pairs of a sparse round."""

    def __init__(self, names: list[str], measured: list[tuple[str, str, float]]) -> None:
        self.names, self.measured = names, measured

    def cluster_topology(self) -> NodeInventory:
        topology = topology_pb2.NodeTopology(nics=[topology_pb2.Nic(name="eth0", rate_gbps=100.0)])
        return NodeInventory(tuple(NodeInfo(n, n[0], NodeState.READY, "gloo", topology=topology) for n in self.names))

    def measured_pairs(self) -> list[PairMeasurement]:
        return [_pair(a, b, bw) for a, b, bw in self.measured]


def _pair(a: str, b: str, bandwidth_gbps: float) -> PairMeasurement:
    return PairMeasurement(a, b, bandwidth_gbps, 4.0, "probe", datetime(2026, 1, 1, tzinfo=UTC))


def test_a_sparse_sample_s_missing_pairs_are_inferred_from_what_it_measured_and_marked() -> None:
    cluster, names, ring = _two_racks_sampled()
    client = _Probed(names, [*ring, ("a1", "b1", 5.0), ("a2", "b3", 5.2)])
    pairs, _, _ = _pair_matrix(client, cluster, names)  # type: ignore[arg-type]
    assert pairs.get("a1", "a2").source == "measured" and pairs.get("a1", "a2").bandwidth_gbps == 11.0
    inside = pairs.get("a1", "a3")
    assert inside.source == "inferred" and inside.bandwidth_gbps == 11.0, "the rack's measured median"
    across = pairs.get("a3", "b2")
    assert across.source == "inferred" and across.bandwidth_gbps == 5.1, "the rack pair's measured median"
    # The nominal model would have said 12.5 GB/s (a 100 Gb/s NIC) for both.
    full = parse_cluster_config({**cluster.model_dump(by_alias=True, mode="json"), "search": {"probeSampling": "full"}})
    assert _pair_matrix(client, full, names)[0].get("a3", "b2").source == "modelled"  # type: ignore[arg-type]


class _Prober(_Probed):
    """Also runs probe rounds of listed pairs at once, with figures from ``truth``."""

    def __init__(self, names: list[str], measured: list[tuple[str, str, float]], truth: dict[str, float]) -> None:
        super().__init__(names, measured)
        self.truth, self.rounds = truth, []  # type: list[list[tuple[str, str]]]

    def start_probe_round(self, request: ProbeRequest) -> ProbeRound:
        assert not request.nodes, "a ring check lists its pairs"
        pairs = list(request.pairs)
        self.rounds.append(pairs)
        found = [(a, b, self.truth.get(a[0] + b[0], 5.0)) for a, b in pairs]
        self.measured += found
        return ProbeRound(
            round_id=f"pr-{len(self.rounds)}",
            status=ProbeStatus.SUCCEEDED,
            message="",
            nodes=(),
            sampling="",
            measurements=tuple(_pair(a, b, bw) for a, b, bw in found),
        )


def test_the_ring_planned_from_a_sparse_sample_has_its_inferred_pairs_probed() -> None:
    cluster, names, ring = _two_racks_sampled()
    sampled = [*ring, ("a1", "b1", 5.0), ("a2", "b3", 5.2)]
    client = _Prober(names, list(sampled), truth={"ab": 4.0, "ba": 4.0})
    assert check_ring(client, cluster, names) >= 1  # type: ignore[arg-type]
    probed = {tuple(sorted(p)) for r in client.rounds for p in r}
    assert probed and not probed & {tuple(sorted((a, b))) for a, b, _ in sampled}, "only pairs not yet measured"
    assert any(a[0] != b[0] for a, b in probed), "the ring's crossings were inferred, now measured"
    pairs, _, _ = _pair_matrix(client, cluster, names)  # type: ignore[arg-type]
    assert all(pairs.get(*p).source == "measured" for p in probed)
    # Nothing left to check on a ring whose edges are all measured: no further round.
    order = plan_rank_map(pairs, slots=1, rack_of=cluster.rack_of()).planned.order
    if all(pairs.get(order[i], order[(i + 1) % 8]).source == "measured" for i in range(8)):
        before = len(client.rounds)
        check_ring(client, cluster, names)  # type: ignore[arg-type]
        assert len(client.rounds) == before


BLOCK = {1: "A", 2: "B", 3: "A", 4: "B"}


class _Blocks(_Probed):
    """Nodes n1..n8 in racks of two, rack-1 and rack-3 in Topograph block A, rack-2 and rack-4 in block B (`BLOCK`):
    the labels their agents registered with."""

    def cluster_topology(self) -> NodeInventory:
        nodes = super().cluster_topology().nodes
        return NodeInventory(
            tuple(
                dataclasses.replace(n, labels={"network.topology.nvidia.com/block": BLOCK[self.rack(n.name)]})
                for n in nodes
            )
        )

    @staticmethod
    def rack(name: str) -> int:
        return (int(name[1:]) + 1) // 2


def test_the_tiers_nodes_register_keep_each_block_together_on_the_planned_ring(tmp_path: Path) -> None:
    names = [f"n{i}" for i in range(1, 9)]
    racks = [{"name": f"rack-{r}", "nodes": [{"name": n} for n in names if _Blocks.rack(n) == r]} for r in range(1, 5)]
    cluster = parse_cluster_config(
        {"apiVersion": "topo-tune/v1", "backend": "gloo", "racks": racks, "search": {"probeSampling": "full"}}
    )
    client = _Blocks(names, [("n1", "n3", 4.0)])
    pairs, topologies, _ = _pair_matrix(client, cluster, names)  # type: ignore[arg-type]
    assert (pairs.get("n1", "n2").hops, pairs.get("n1", "n5").hops, pairs.get("n1", "n4").hops) == (2, 4, 6)
    assert pairs.get("n1", "n3").source == "measured" and pairs.get("n1", "n3").bandwidth_gbps == 4.0
    tiers = network_tiers(client.cluster_topology().nodes, names)
    assert tiers["n3"] == ("B",)
    built = plan_study(
        cluster,
        names=names,
        pairs=pairs,
        topologies=topologies,
        slots=dict.fromkeys(names, 1),
        name="init/blocks",
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        tiers=tiers,
    )
    optimized = next(o.nodes for o in built.space.rank_orders if o.name == "optimized")
    block = [BLOCK[_Blocks.rack(n)] for n in optimized]
    assert sum(block[i] != block[i - 1] for i in range(8)) == 2, optimized
