"""A synthetic performance landscape for tuner tests: a known optimum, interactions, seeded noise.

Times follow ``latency + bytes / bandwidth`` per collective, with each knob scaling latency or bandwidth
(the rank order most, with interactions: more IB QPs help much more on the spine-crossing orders). Noise is
log-normal and seeded by (configuration, trial, side, repeat), so a run is reproducible and two
measurements of one configuration still differ. ``flat=True`` makes every knob irrelevant (the
"defaults are optimal" landscape).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from topo_tune.errors import FailureKind, TrialFailed
from topo_tune.tuner.objective import Measurements, Objective, SizeSample
from topo_tune.tuner.space import NATURAL_ORDER, Fabric, RankOrder, SearchSpace, TrialConfig
from topo_tune.tuner.study import MeasurementRequest

NODES = ("node-1", "node-2", "node-3", "node-4")
ORDERS = (
    RankOrder(NATURAL_ORDER, NODES),
    RankOrder("optimized", ("node-1", "node-3", "node-2", "node-4")),
    RankOrder("hostname", ("node-1", "node-4", "node-2", "node-3")),
)
_BUS = {"all_reduce": 2 * 31 / 32, "all_gather": 31 / 32, "reduce_scatter": 31 / 32}


def synthetic_space(**overrides: object) -> SearchSpace:
    kwargs: dict[str, object] = {
        "nccl_version": "2.28.3",
        "fabric": Fabric(nodes=4, ib=True, nvls=False),
        "collectives": ("all_reduce", "all_gather"),
        "rank_orders": ORDERS,
        "site_fixed": {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "eth0"},
    }
    kwargs.update(overrides)
    return SearchSpace.build(**kwargs)  # type: ignore[arg-type]


@dataclass
class Landscape:
    """Callable as a study's evaluator; counts calls per purpose."""

    noise: float = 0.02
    flat: bool = False
    seed: int = 0
    fail: Callable[[TrialConfig], FailureKind | None] = lambda config: None
    calls: dict[str, int] = field(default_factory=lambda: {"search": 0, "proof": 0})

    def factors(self, env: Mapping[str, str], order: str) -> tuple[float, float]:
        """(latency µs, bandwidth GB/s) of a configuration, without noise."""
        lat, bw = 20.0, 100.0
        if self.flat:
            return lat, bw
        bw *= {"natural": 1.0, "optimized": 1.35, "hostname": 0.7}[order]
        channels = int(env.get("NCCL_MIN_CTAS", "16"))
        bw *= math.exp(-0.05 * math.log2(channels / 24) ** 2)
        lat *= 1.0 + 0.03 * abs(math.log2(channels / 8))
        threads = int(env.get("NCCL_NTHREADS", "512"))
        bw *= {64: 0.75, 128: 0.9, 256: 0.97, 512: 1.0}[threads]
        lat *= 0.98 if threads == 256 else 1.0
        buff = int(env.get("NCCL_BUFFSIZE", str(4 << 20))) >> 20
        bw *= {1: 0.9, 2: 0.96, 4: 1.0, 8: 1.04, 16: 1.05}[buff]
        lat *= 1.03 if buff == 16 else 1.0
        qps = int(env.get("NCCL_IB_QPS_PER_CONNECTION", "1"))
        gain = {1: 1.0, 2: 1.06, 4: 1.12, 8: 1.10} if order != "optimized" else {1: 1.0, 2: 1.02, 4: 1.03, 8: 1.01}
        bw *= gain[qps]
        lat += math.log2(qps)
        if env.get("NCCL_IB_SPLIT_DATA_ON_QPS") == "1":
            lat += 2.0
        bw *= {"0": 1.03, "1": 0.92}.get(env.get("NCCL_CROSS_NIC", ""), 1.0)
        if env.get("NCCL_PXN_DISABLE") == "1":
            bw *= 0.95
        return lat, bw

    def time_us(self, collective: str, size: int, env: Mapping[str, str], order: str) -> float:
        lat, bw = self.factors(env, order)
        return lat + size / (bw * 1e3) * _BUS.get(collective, 1.0)

    def __call__(self, config: TrialConfig, request: MeasurementRequest) -> Measurements:
        self.calls[request.purpose] += 1
        kind = self.fail(config)
        if kind is not None:
            raise TrialFailed(f"synthetic {kind} for {dict(config.params)}", kind=kind)
        where = f"{request.trial}|{request.side}|{request.repeat}|{request.run}|{request.sizes}"
        token = f"{self.seed}|{sorted(config.env.items())}|{config.rank_order.name}|{where}"
        rng = random.Random(hashlib.sha256(token.encode()).digest())
        samples = []
        for collective in request.collectives:
            for size in request.sizes:
                t = self.time_us(collective, size, config.env, config.rank_order.name)
                t *= math.exp(rng.gauss(0.0, self.noise))
                busbw = size / (t * 1e3) * _BUS.get(collective, 1.0)
                samples.append(SizeSample(collective, size, t, busbw, "ring", "simple", 16))
        return Measurements(tuple(samples), simulated=True)


def exhaustive_optimum(
    space: SearchSpace, objective: Objective, landscape: Landscape, ladder: tuple[int, ...]
) -> float:
    """The best objective value any configuration of the space reaches, noise-free."""
    quiet = Landscape(noise=0.0, flat=landscape.flat)
    request = MeasurementRequest(objective.collectives, ladder, 0, "search")
    baseline = quiet(space.config(space.baseline_params()), request)
    best = 0.0
    for values in itertools.product(*(space.values_of(n) for n in space.names)):
        config = space.config(dict(zip(space.names, values, strict=True)))
        best = max(best, objective.value(quiet(config, request), baseline))
    return best
