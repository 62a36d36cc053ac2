"""An :class:`~topo_tune.tuner.evaluation.Evaluator` over the ``sim`` model, and the space that fits a sim cluster.

Purpose: studies without hardware — the search-efficiency benchmark, the acceptance tests (the demo
cluster, the cluster where NCCL's defaults are optimal) and offline what-ifs. Each call simulates the
requested collectives and sizes for the trial's environment and rank order; the noise seed is derived
from the study seed and the request (trial, side, repeat), so repeats differ and runs reproduce. Every
result is labelled simulated. With ``noise=False`` it returns the model's noise-free times (for
exhaustive sweeps).

Non-goals: the agents' ``sim`` backend (which runs the same model behind a benchmark job).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from topo_tune.sim import Cluster, Transport
from topo_tune.sim.tuner_table import simulate_with_table
from topo_tune.tuner.evaluation import MeasurementRequest
from topo_tune.tuner.objective import Measurements, SizeSample
from topo_tune.tuner.space import NATURAL_ORDER, Fabric, RankOrder, SearchSpace, TrialConfig

__all__ = ["SimEvaluator", "sim_fabric", "sim_rank_orders", "sim_space"]


@dataclass(frozen=True)
class SimEvaluator:
    cluster: Cluster
    seed: int = 0
    noise: bool = True

    def __call__(self, config: TrialConfig, request: MeasurementRequest) -> Measurements:
        token = f"{self.seed}|{request.trial}|{request.purpose}|{request.side}|{request.repeat}|{request.sizes}"
        if request.run:
            token += f"|run {request.run}"
        seed = int.from_bytes(hashlib.sha256(token.encode()).digest()[:8], "big")
        samples = []
        for collective in request.collectives:
            result = simulate_with_table(
                self.cluster,
                collective=collective,
                sizes=request.sizes,
                env=dict(config.env),
                rank_order=config.rank_order.nodes,
                seed=seed,
                table=config.tuner_table,
            )
            for s in result.sizes:
                time_us = s.time_us if self.noise else s.model_time_us
                samples.append(
                    SizeSample(
                        collective,
                        s.bytes,
                        time_us,
                        s.busbw_gbs * s.time_us / time_us,
                        s.algorithm,
                        s.protocol,
                        s.channels,
                        s.offered,
                        s.nccl,
                    )
                )
        return Measurements(tuple(samples), simulated=True)


def sim_fabric(cluster: Cluster) -> Fabric:
    """The fabric a sim cluster describes (IB or sockets, NVLS-capable nodes)."""
    transports = {n.transport for n in cluster.nodes if n.nics}
    return Fabric(
        nodes=len(cluster.nodes),
        ib=bool(transports - {Transport.SOCKET}),
        socket=Transport.SOCKET in transports,
        nvls=all(n.fabric.nvls for n in cluster.nodes),
    )


def sim_rank_orders(cluster: Cluster, optimized: Sequence[str] | None = None) -> list[RankOrder]:
    """NCCL's natural order (the cluster's listing), the optimizer's when given, and the hostname order."""
    natural = tuple(cluster.node_names)
    orders = [RankOrder(NATURAL_ORDER, natural)]
    if optimized is not None and tuple(optimized) != natural:
        orders.append(RankOrder("optimized", tuple(optimized)))
    hostname = tuple(sorted(natural))
    if hostname not in {o.nodes for o in orders}:
        orders.append(RankOrder("hostname", hostname))
    return orders


def sim_space(
    cluster: Cluster,
    *,
    nccl_version: str,
    collectives: Sequence[str],
    optimized: Sequence[str] | None = None,
    knobs: Sequence[str] | None = None,
) -> SearchSpace:
    return SearchSpace.build(
        nccl_version=nccl_version,
        fabric=sim_fabric(cluster),
        collectives=collectives,
        rank_orders=sim_rank_orders(cluster, optimized),
        knobs=knobs,
    )
