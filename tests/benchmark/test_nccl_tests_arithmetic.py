"""nccl-tests arithmetic: sizes, counts, bus factors, per-iteration statistics."""

from __future__ import annotations

import pytest

from topo_tune.benchmark.collectives import bandwidth, bus_factor, shape
from topo_tune.benchmark.iteration_stats import IterationStats
from topo_tune.benchmark.sweep import MAX_BYTES_LIMIT, SizeSweep, size_ladder
from topo_tune.errors import SweepError
from topo_tune.nccl.collectives import Collective


def test_sweep_walks_like_nccl_tests_b_e_f() -> None:
    # all_reduce_perf -b 8 -e 128M -f 2 prints 25 sizes: 8, 16, ..., 134217728.
    sizes = SizeSweep(8, 128 * 1024 * 1024, 2).sizes()
    assert len(sizes) == 25
    assert sizes[0] == 8 and sizes[-1] == 134217728
    # -f 4 from 1K to 1M: 1K 4K 16K 64K 256K 1M; a max that is not on the grid is not reached.
    assert SizeSweep(1024, 1 << 20, 4).sizes() == (1024, 4096, 16384, 65536, 262144, 1048576)
    assert SizeSweep(1000, 5000, 2).sizes() == (1000, 2000, 4000)
    assert SizeSweep(4096, 4096, 0).sizes() == (4096,)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_bytes": 0, "max_bytes": 8}, "min_bytes"),
        ({"min_bytes": 16, "max_bytes": 8}, "max_bytes"),
        ({"min_bytes": 8, "max_bytes": 64, "step_factor": 1}, "step_factor"),
        ({"min_bytes": 8, "max_bytes": 1 << 40}, "max_bytes"),
    ],
)
def test_bad_sweeps_name_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(SweepError, match=field):
        SizeSweep(**kwargs)


def test_the_widest_sweep_allowed_stays_short() -> None:
    assert len(SizeSweep(1, MAX_BYTES_LIMIT, 2).sizes()) == 35


def test_bus_factors_are_nccl_tests_factors() -> None:
    assert bus_factor(Collective.ALL_REDUCE, 8) == pytest.approx(2 * 7 / 8)
    for c in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALLTOALL):
        assert bus_factor(c, 8) == pytest.approx(7 / 8)
    for c in (Collective.BROADCAST, Collective.REDUCE, Collective.SENDRECV):
        assert bus_factor(c, 8) == 1.0
    assert bus_factor(Collective.ALL_REDUCE, 1) == 0.0


def test_all_reduce_counts_and_bandwidth() -> None:
    shp = shape(Collective.ALL_REDUCE, size_bytes=1 << 20, element_size=4, nranks=8)
    assert (shp.reported_bytes, shp.param_count) == (1 << 20, 262144)
    algbw, busbw = bandwidth(Collective.ALL_REDUCE, shape=shp, seconds=1e-3, nranks=8)
    assert algbw == pytest.approx((1 << 20) / 1e9 / 1e-3)
    assert busbw == pytest.approx(algbw * 1.75)


def test_gathers_round_the_per_rank_part_to_16_bytes() -> None:
    # 1 MiB of floats over 3 ranks: 262144 // 3 = 87381 -> 87380 (a multiple of 4 floats).
    ag = shape(Collective.ALL_GATHER, size_bytes=1 << 20, element_size=4, nranks=3)
    assert (ag.send_count, ag.recv_count, ag.param_count) == (87380, 262140, 87380)
    assert ag.reported_bytes == 262140 * 4
    rs = shape(Collective.REDUCE_SCATTER, size_bytes=1 << 20, element_size=4, nranks=3)
    assert (rs.send_count, rs.recv_count, rs.param_count) == (262140, 87380, 87380)
    a2a = shape(Collective.ALLTOALL, size_bytes=1 << 20, element_size=4, nranks=3)
    assert (a2a.send_count, a2a.param_count) == (262140, 87380)
    algbw, busbw = bandwidth(Collective.ALL_GATHER, shape=ag, seconds=1.0, nranks=3)
    assert algbw == pytest.approx(87380 * 4 * 3 / 1e9)
    assert busbw == pytest.approx(algbw * 2 / 3)


def test_rooted_and_reducing_collectives_print_like_nccl_tests() -> None:
    assert (Collective.BROADCAST.root, Collective.BROADCAST.redop_name) == (0, "none")
    assert (Collective.REDUCE.root, Collective.REDUCE.redop_name) == (0, "sum")
    assert (Collective.ALL_GATHER.root, Collective.ALL_GATHER.redop_name) == (-1, "none")


def test_iteration_stats_follow_nccl_tests_definitions() -> None:
    samples = [float(x) for x in range(1, 21)]  # 1..20
    stats = IterationStats.from_samples(samples)
    assert stats.p50_us == 11.0  # sorted[n // 2]
    assert stats.p99_us == 20.0  # nearest rank
    assert stats.mean_us == pytest.approx(10.5)
    assert stats.cv == pytest.approx((sum((x - 10.5) ** 2 for x in samples) / 20) ** 0.5 / 10.5)
    assert IterationStats.from_samples([5.0]).cv == 0.0
    with pytest.raises(ValueError, match="at least one"):
        IterationStats.from_samples([])


def test_the_size_ladder_is_nccl_tests_walk() -> None:
    assert size_ladder(min_bytes=1024, max_bytes=1 << 20, step_factor=4) == (1024, 4096, 16384, 65536, 262144, 1048576)
    assert size_ladder(min_bytes=4096, max_bytes=1 << 20, step_factor=1) == (4096,)
    assert size_ladder(min_bytes=4096, max_bytes=1024, step_factor=2) == ()
    with pytest.raises(SweepError, match="min_bytes"):
        size_ladder(min_bytes=0, max_bytes=1024, step_factor=2)
