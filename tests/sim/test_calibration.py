"""The sim backend against published and measured nccl-tests figures (sources in docs/sim.md).

Each point must land within 15% of the cited figure; the shape checks pin the knob effects a tuner will
meet (which knob wins or loses at which size, and by roughly how much).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from topo_tune.sim import Cluster, simulate
from topo_tune.sim.demo import defaults_optimal_cluster, h200_vm_pair, ndr_pair

TOLERANCE = 0.15
GIB = 1 << 30
MIB = 1 << 20


def _one(
    cluster: Cluster,
    collective: str,
    size: int,
    env: Mapping[str, str] | None = None,
) -> tuple[float, float]:
    """(noise-free time in µs, busbw in GB/s from that time) for one size."""
    result = simulate(
        cluster,
        collective=collective,
        sizes=[size],
        env=env or {},
        rank_order=cluster.node_names,
        seed=0,
    )
    point = result.sizes[0]
    return point.model_time_us, point.busbw_gbs * point.time_us / point.model_time_us


def _within(value: float, target: float) -> bool:
    return abs(value - target) <= TOLERANCE * target


@pytest.mark.parametrize("size", [GIB, 8 * GIB])
def test_8x_h100_nvswitch_ring_allreduce_reaches_365_to_370_gbs_with_nvls_off(size: int) -> None:
    # NVIDIA/nccl#1455, nccl-tests#212: ~365-370 GB/s busbw, NVLS off, large sizes.
    _, busbw = _one(defaults_optimal_cluster(), "all_reduce", size, {"NCCL_NVLS_ENABLE": "0"})
    assert _within(busbw, 367.5), busbw


def test_8x_h100_allreduce_with_nvls_reaches_about_480_gbs() -> None:
    # nccl-tests#212 and NVIDIA/nccl#1455: NVLS all_reduce ~480 GB/s busbw on 8x H100.
    _, busbw = _one(defaults_optimal_cluster(), "all_reduce", 8 * GIB)
    assert _within(busbw, 480.0), busbw


@pytest.mark.parametrize(("gpus", "nics"), [(8, 8), (8, 4), (1, 1)])
def test_ring_allreduce_across_nodes_gives_46_to_48_gbs_per_ndr_nic(gpus: int, nics: int) -> None:
    # nccl-tests#290 (NVIDIA): 46-48 GB/s per NDR 400G NIC through NCCL; NCCL_ALGO=Ring measures the fabric.
    _, busbw = _one(ndr_pair(gpus=gpus, nics=nics), "all_reduce", GIB, {"NCCL_ALGO": "Ring"})
    assert _within(busbw / nics, 47.0), busbw / nics


_CTAS = {"NCCL_MIN_CTAS": "", "NCCL_MAX_CTAS": ""}


def _ctas(n: int) -> dict[str, str]:
    return dict.fromkeys(_CTAS, str(n))


# nccl-tests 2.19.6 all_reduce_perf on a 2x H200 VM (NVLink, NCCL 2.28.3, NVLS off); out-of-place times.
_H200_TIMES = [
    ("defaults", {}, 512, 19.4),
    ("defaults", {}, 32768, 19.7),
    ("defaults", {}, 2 * MIB, 29.9),
    ("defaults", {}, 8 * MIB, 49.7),
    ("defaults", {}, 128 * MIB, 472.9),
    ("defaults", {}, 512 * MIB, 1726.2),
    ("4 CTAs", _ctas(4), 512, 19.2),
    ("4 CTAs", _ctas(4), 8 * MIB, 120.4),
    ("4 CTAs", _ctas(4), 512 * MIB, 6514.8),
    ("16 CTAs", _ctas(16), 512, 13.8),
    ("16 CTAs", _ctas(16), 32768, 13.9),
    ("16 CTAs", _ctas(16), 512 * MIB, 2067.4),
    ("32 CTAs", _ctas(32), 512, 13.6),
    ("32 CTAs", _ctas(32), 512 * MIB, 1643.6),
    ("NTHREADS=256", {"NCCL_NTHREADS": "256"}, 512 * MIB, 2034.2),
    ("BUFFSIZE=16MiB", {"NCCL_BUFFSIZE": str(16 * MIB)}, 512 * MIB, 1738.8),
]


@pytest.mark.parametrize(("label", "env", "size", "measured_us"), _H200_TIMES)
def test_2x_h200_allreduce_times_match_the_measured_run(
    label: str, env: dict[str, str], size: int, measured_us: float
) -> None:
    time_us, _ = _one(h200_vm_pair(), "all_reduce", size, env)
    assert _within(time_us, measured_us), (label, size, time_us)


@pytest.mark.parametrize(
    ("collective", "measured_busbw"),
    [
        ("all_reduce", 283.8),
        ("all_gather", 231.0),
        ("reduce_scatter", 225.0),
        ("alltoall", 266.0),
        ("sendrecv", 286.0),
    ],
)
def test_2x_h200_default_busbw_at_128_mib_matches_the_measured_run(collective: str, measured_busbw: float) -> None:
    _, busbw = _one(h200_vm_pair(), collective, 128 * MIB)
    assert _within(busbw, measured_busbw), busbw


def test_2x_h200_knob_shapes_match_the_measured_run() -> None:
    cluster = h200_vm_pair()

    def t(size: int, env: dict[str, str]) -> float:
        return _one(cluster, "all_reduce", size, env)[0]

    # 16 CTAs win ~1.4x at 32 KB and lose ~1.2x at 512 MB.
    assert 1.25 < t(32768, {}) / t(32768, _ctas(16)) < 1.6
    assert 1.1 < t(512 * MIB, _ctas(16)) / t(512 * MIB, {}) < 1.3
    # 4 CTAs collapse at large sizes (~3.8x slower) but cost nothing at tiny ones.
    assert t(512 * MIB, _ctas(4)) / t(512 * MIB, {}) > 3.0
    assert abs(t(512, _ctas(4)) / t(512, {}) - 1.0) < 0.05
    # NTHREADS=256 loses ~15% at large sizes.
    assert 1.08 < t(512 * MIB, {"NCCL_NTHREADS": "256"}) / t(512 * MIB, {}) < 1.25
    # A 16 MiB buffer changes little on NVLink (within 5% everywhere measured).
    for size in (512, 2 * MIB, 512 * MIB):
        assert abs(t(size, {"NCCL_BUFFSIZE": str(16 * MIB)}) / t(size, {}) - 1.0) < 0.06
