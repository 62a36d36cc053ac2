"""The ``sim`` benchmark backend: an analytic model of NCCL collectives over a described cluster.

It gives a tuner a realistic landscape without GPUs: α–β costs per link, ring/tree/NVLS algorithms,
LL/LL128/Simple protocols, channel/thread/buffer effects, NIC rails, a rack spine with ECMP hashing,
ring order, and seeded noise. Every figure it produces is labelled simulated. The model and its
calibration sources are described in ``docs/sim.md``.

Pure: no gRPC, no hardware, no I/O. Non-goal: predicting a specific cluster to the percent.
"""

from topo_tune.benchmark.collectives import bus_factor
from topo_tune.errors import SimInputError
from topo_tune.nccl.collectives import Collective
from topo_tune.sim.cluster import (
    Cluster,
    FabricKind,
    GpuProfile,
    IntraNodeFabric,
    Nic,
    Node,
    NodePairMeasurement,
    RackPairBandwidth,
    RackUplink,
    SpineTier,
    Transport,
)
from topo_tune.sim.demo import defaults_optimal_cluster, demo_cluster
from topo_tune.sim.knobs import MODELLED_VARIABLES, Algorithm, NcclKnobs, Protocol, parse_env
from topo_tune.sim.simulate import SimResult, SimSizeResult, simulate, to_benchmark_result

__all__ = [
    "MODELLED_VARIABLES",
    "Algorithm",
    "Cluster",
    "Collective",
    "FabricKind",
    "GpuProfile",
    "IntraNodeFabric",
    "NcclKnobs",
    "Nic",
    "Node",
    "NodePairMeasurement",
    "Protocol",
    "RackPairBandwidth",
    "RackUplink",
    "SimInputError",
    "SimResult",
    "SimSizeResult",
    "SpineTier",
    "Transport",
    "bus_factor",
    "defaults_optimal_cluster",
    "demo_cluster",
    "parse_env",
    "simulate",
    "to_benchmark_result",
]
