"""The per-size search: options from what NCCL offered, composed rows, and the plan a study follows."""

from __future__ import annotations

from collections.abc import Mapping

from topo_tune.plugin.table import parse_tuner_table
from topo_tune.tuner.objective import Measurements, Objective, SizeSample, WorkloadProfile
from topo_tune.tuner.size_options import (
    MARGIN,
    Option,
    StoredTrial,
    bases,
    compose,
    offered_by_bucket,
    option_table,
    options_for,
    plan_next,
)
from topo_tune.tuner.trial_store import TrialRole

KIB, MIB = 1024, 1 << 20
# Two sizes in each of three buckets: 64K-1M (tree-sized), 1M-16M and 16M-4G.
SIZES = (256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
MID, LARGE = (256 * KIB, MIB), (64 * MIB, 256 * MIB)
ALL = ("tree/ll", "tree/ll128", "tree/simple", "ring/ll", "ring/ll128", "ring/simple")
# NCCL's picks under the base: tree up to 16 MiB, ring/LL128 above.
NCCL = {s: "tree/ll" if s <= 16 * MIB else "ring/ll128" for s in SIZES}
OBJECTIVE = Objective(WorkloadProfile({"all_reduce": 1.0}, {"0-1K": 0.0, "1K-64K": 0.0}))
NODES, RANKS = 8, 64


def measured(
    times: Mapping[int, float],
    *,
    offered: Mapping[int, tuple[str, ...]] | None = None,
    nccl: Mapping[int, str] | None = None,
    collective: str = "all_reduce",
) -> Measurements:
    return Measurements(
        tuple(
            SizeSample(
                collective,
                size,
                time,
                size / time / 1e3,
                offered=(offered or {}).get(size, ALL),
                nccl=(nccl or NCCL)[size],
            )
            for size, time in times.items()
        )
    )


def times(scale: Mapping[int, float] | None = None) -> dict[int, float]:
    """Baseline times (1 µs per KiB, at least 20 µs), divided by a per-size speedup."""
    return {s: max(20.0, s / KIB) / (scale or {}).get(s, 1.0) for s in SIZES}


BASELINE = measured(times())


def trial(
    number: int,
    m: Measurements | None,
    *,
    role: str = "sampled",
    env: Mapping[str, str] | None = None,
    order: str = "natural",
    key: str = "",
    table: str = "",
    finished: bool = True,
    value: float | None = 1.0,
) -> StoredTrial:
    return StoredTrial(
        number=number,
        role=role,
        key=key,
        finished=finished,
        value=value if finished and m is not None else None,
        env=env or {},
        rank_order=order,
        params={"order": order, **(env or {})},
        measurements=m,
        table=table,
    )


def rows_of(text: str) -> list[tuple[str, int, int, str | None, str | None, int | None]]:
    return [
        (r.collective, r.min_bytes, r.max_bytes, r.algorithm, r.protocol, r.channels) for r in parse_tuner_table(text)
    ]


def test_an_option_that_wins_a_bucket_gets_an_explicit_algorithm_protocol_row() -> None:
    base = trial(0, BASELINE, role="baseline")
    ring = Option("ring/ll128", None)
    tree = Option("tree/ll128", None)
    everywhere = frozenset(offered_by_bucket(BASELINE, OBJECTIVE))
    measured_options = {
        ring: (everywhere, measured(times({s: 1.3 for s in MID}))),  # ring/LL128 wins the tree-sized bucket
        tree: (everywhere, measured(times({s: 1.2 for s in LARGE}))),  # tree/LL128 wins the large one
    }

    table = compose(base, measured_options, BASELINE, OBJECTIVE, nodes=NODES, ranks=RANKS)

    assert table is not None
    assert rows_of(table.text) == [
        ("allreduce", 65537, MIB, "ring", "ll128", None),
        ("allreduce", 16 * MIB + 1, 4294967295, "tree", "ll128", None),
    ]
    assert all(line.endswith(f",{NODES},{RANKS}") for line in table.text.splitlines()[1:]), "keyed by communicator"
    assert [round(r.speedup, 3) for r in table.rows] == [1.3, 1.2]


def test_a_channel_count_that_wins_gets_a_channel_only_row_and_small_gains_get_none() -> None:
    base = trial(0, BASELINE, role="baseline")
    everywhere = frozenset(offered_by_bucket(BASELINE, OBJECTIVE))
    options = {
        Option(None, 8): (everywhere, measured(times({s: 1.1 for s in LARGE}))),
        Option("ring/simple", None): (everywhere, measured(times({s: 1 + MARGIN / 2 for s in MID}))),
    }
    table = compose(base, options, BASELINE, OBJECTIVE, nodes=NODES, ranks=RANKS)
    assert table is not None
    assert rows_of(table.text) == [("allreduce", 16 * MIB + 1, 4294967295, None, None, 8)]


def test_only_entries_nccl_offered_at_every_size_of_a_bucket_are_options_there() -> None:
    # NCCL rules ring/LL128 out at 1 MiB (one size of the tree-sized bucket) and never offers tree/simple.
    offered = {s: tuple(e for e in ALL if e != "tree/simple") for s in SIZES}
    offered[MIB] = tuple(e for e in offered[MIB] if e != "ring/ll128")
    base = trial(0, measured(times(), offered=offered), role="baseline")

    options = options_for(base, [], BASELINE, OBJECTIVE)

    assert Option("tree/simple", None) not in options
    covered = {b.name for _, b in options[Option("ring/ll128", None)]}
    assert covered == {"1M-16M"}, "not 64K-1M (ruled out at 1 MiB), not 16M-4G (NCCL's pick there already)"
    # Even if the forced entry measured faster where it was not offered, no row may name it there.
    m = measured(times({s: 1.5 for s in SIZES}))
    table = compose(
        base,
        {Option("ring/ll128", None): (options[Option("ring/ll128", None)], m)},
        BASELINE,
        OBJECTIVE,
        nodes=NODES,
        ranks=RANKS,
    )
    assert table is not None
    assert rows_of(table.text) == [("allreduce", MIB + 1, 16 * MIB, "ring", "ll128", None)]


def test_buckets_the_workload_does_not_weigh_get_no_option_and_no_row() -> None:
    small = (512, 4 * KIB)  # 0-1K and 1K-64K, both weight 0 in OBJECTIVE
    sizes = {**{s: 20.0 for s in small}, **times()}
    nccl = {**{s: "tree/ll" for s in small}, **NCCL}
    base = trial(0, measured(sizes, nccl=nccl), role="baseline")
    options = options_for(base, [], BASELINE, OBJECTIVE)
    assert all(b.name not in ("0-1K", "1K-64K") for covered in options.values() for _, b in covered)
    everything = frozenset((c, b) for c in OBJECTIVE.collectives for b in OBJECTIVE.buckets)
    faster = measured({**{s: 10.0 for s in small}, **times()}, nccl=nccl)
    assert (
        compose(
            base,
            {Option("ring/ll", None): (everything, faster)},
            measured(sizes, nccl=nccl),
            OBJECTIVE,
            nodes=NODES,
            ranks=RANKS,
        )
        is None
    )


def test_a_backend_that_reports_no_choices_plans_nothing() -> None:
    unknown = Measurements(tuple(SizeSample("all_reduce", s, t, s / t / 1e3) for s, t in times().items()))
    assert plan_next([trial(0, unknown, role="baseline")], unknown, OBJECTIVE, nodes=NODES, ranks=RANKS) == ((), False)


def test_channel_options_come_from_search_winners_below_the_bases_count() -> None:
    base = trial(0, BASELINE, role="baseline")
    winner = trial(3, measured(times({s: 1.2 for s in LARGE})), env={"NCCL_MIN_CTAS": "8", "NCCL_MAX_CTAS": "8"})
    loser = trial(4, measured(times({s: 0.8 for s in SIZES})), env={"NCCL_MIN_CTAS": "2", "NCCL_MAX_CTAS": "2"})
    options = options_for(base, [winner, loser], BASELINE, OBJECTIVE)
    assert [o for o in options if o.entry is None] == [Option(None, 8)]
    capped = trial(1, BASELINE, env={"NCCL_MIN_CTAS": "4", "NCCL_MAX_CTAS": "4"})
    assert not [o for o in options_for(capped, [winner], BASELINE, OBJECTIVE) if o.entry is None], (
        "NCCL caps a row at the communicator's 4 channels: 8 is no option there"
    )


def test_the_plan_measures_each_option_once_then_composes_once_per_base() -> None:
    natural = trial(0, BASELINE, role="baseline", value=1.0)
    racks = trial(1, measured(times({s: 1.9 for s in LARGE} | {s: 0.9 for s in MID})), order="racks", value=1.1)
    worse_racks = trial(2, measured(times({s: 0.5 for s in SIZES})), order="racks", value=0.5)
    trials = [natural, racks, worse_racks]

    planned, pending = plan_next(trials, BASELINE, OBJECTIVE, nodes=NODES, ranks=RANKS)

    assert not pending
    assert {p.role for p in planned} == {TrialRole.OPTION}
    assert {p.base for p in planned} == {1, 0}, "the best configuration of each rank order"
    assert len({p.key for p in planned}) == len(planned)
    for p in planned:
        assert all(r.algorithm is not None or r.channels is not None for r in parse_tuner_table(p.table))
    # Enqueued, not yet measured: nothing new, and the study waits for them.
    enqueued = [
        trial(
            10 + i, None, role=p.role, key=p.key, table=p.table, finished=False, order="racks" if p.base else "natural"
        )
        for i, p in enumerate(planned)
    ]
    assert plan_next(trials + enqueued, BASELINE, OBJECTIVE, nodes=NODES, ranks=RANKS) == ((), True)
    # Measured: ring/LL128 wins the tree-sized bucket on the natural base; on the racks base, whose order slowed
    # that bucket to 0.9x, every option that kept it at 1.0x wins it back.
    done = []
    for t, p in zip(enqueued, planned, strict=True):
        scale = {s: 1.25 for s in MID} if p.key == "option:0:ring/ll128" else {}
        done.append(trial(t.number, measured(times(scale)), role=p.role, key=p.key, table=p.table, order=t.rank_order))
    composed, pending = plan_next(trials + done, BASELINE, OBJECTIVE, nodes=NODES, ranks=RANKS)
    by_base = {c.base: c for c in composed}
    assert ({c.role for c in composed}, sorted(by_base), pending) == ({TrialRole.PER_SIZE}, [0, 1], False)
    assert rows_of(by_base[0].table) == [("allreduce", 65537, MIB, "ring", "ll128", None)]
    ((collective, low, high, algorithm, protocol, _),) = rows_of(by_base[1].table)
    assert (collective, low, high) == ("allreduce", 65537, MIB), "the large bucket the racks order wins stays NCCL's"
    assert f"{algorithm}/{protocol}" in ALL
    role = TrialRole.PER_SIZE
    stored = [trial(40 + c.base, measured(times()), role=role, key=c.key, table=c.table) for c in composed]
    assert plan_next([*trials, *done, *stored], BASELINE, OBJECTIVE, nodes=NODES, ranks=RANKS) == ((), False)


EVERY_BUCKET = Objective(WorkloadProfile({"all_reduce": 1.0, "alltoall": 1.0}))  # 0-1K and 1K-64K unmeasured


def test_offered_entries_are_the_intersection_over_every_size_of_the_bucket() -> None:
    offered: dict[int, tuple[str, ...]] = {s: ALL for s in SIZES}
    offered[256 * KIB] = tuple(e for e in ALL if e != "tree/simple")  # first size of 64K-1M
    offered[MIB] = tuple(e for e in ALL if e != "ring/ll")  # second size of 64K-1M
    got = offered_by_bucket(measured(times(), offered=offered), EVERY_BUCKET)
    by_name = {b.name: entries for (c, b), entries in got.items()}
    assert set(by_name) == {"64K-1M", "1M-16M", "16M-4G"}, "weighted buckets without a measured size offer nothing"
    assert by_name["64K-1M"] == frozenset(ALL) - {"tree/simple", "ring/ll"}
    assert by_name["1M-16M"] == by_name["16M-4G"] == frozenset(ALL)


def test_options_come_in_nccls_algorithm_then_protocol_order_with_tables_for_what_they_cover() -> None:
    # The plugin records an entry of a newer NCCL it has no name for as "unknown/...": never an option.
    base = trial(0, measured(times(), offered={s: ("unknown/simple", *ALL, "ring/ll256") for s in SIZES}))
    options = options_for(base, [], BASELINE, OBJECTIVE)
    assert [o.entry for o in options] == [
        "tree/ll",
        "tree/ll128",
        "tree/simple",
        "ring/ll",
        "ring/ll128",
        "ring/simple",
    ]
    ring = Option("ring/ll128", None)
    rows = rows_of(option_table(ring, options[ring], OBJECTIVE, nodes=NODES, ranks=RANKS))
    assert rows == [
        ("allreduce", 65537, MIB, "ring", "ll128", None),
        ("allreduce", MIB + 1, 16 * MIB, "ring", "ll128", None),
    ], "not 16M-4G, where NCCL already picks ring/LL128"


def forced(number: int, count: int, scale: Mapping[int, float], *, role: str = "sampled") -> StoredTrial:
    return trial(
        number, measured(times(scale)), role=role, env={"NCCL_MIN_CTAS": str(count), "NCCL_MAX_CTAS": str(count)}
    )


def channel_options(base: StoredTrial, searched: list[StoredTrial]) -> list[int | None]:
    return [o.channels for o in options_for(base, searched, BASELINE, OBJECTIVE) if o.entry is None]


def test_channel_counts_rank_by_buckets_won_and_skip_what_cannot_apply() -> None:
    base = trial(0, BASELINE, role="baseline")
    unforced = trial(1, measured(times({s: 2.0 for s in SIZES})))  # fastest, but forces no count
    no_measurements = trial(2, None, env={"NCCL_MIN_CTAS": "16", "NCCL_MAX_CTAS": "16"})
    wins_two = forced(3, 8, {s: 1.2 for s in (*LARGE, 4 * MIB, 16 * MIB)})
    wins_mid = forced(4, 2, {s: 1.2 for s in MID}, role="candidate")
    also_mid = forced(5, 4, {s: 1.1 for s in MID})
    searched = [unforced, no_measurements, wins_two, wins_mid, also_mid]
    assert channel_options(base, searched) == [8, 2], "most buckets won first, at most two, best per bucket"
    # The same count measured later with a tie does not displace the first; a bigger win does.
    tie = forced(6, 4, {s: 1.2 for s in MID})
    assert channel_options(base, [wins_mid, tie]) == [2]
    better = forced(7, 4, {s: 1.3 for s in MID})
    assert channel_options(base, [wins_mid, better]) == [4]
    # Within the margin is no win; under a 4-channel communicator 8 is capped to 4, the base's own.
    assert channel_options(base, [forced(8, 8, {s: 1 + MARGIN / 2 for s in LARGE})]) == []
    capped = trial(1, BASELINE, env={"NCCL_MIN_CTAS": "4", "NCCL_MAX_CTAS": "4"})
    assert channel_options(capped, [unforced, wins_two, wins_mid]) == [2]


def test_the_composed_table_records_its_base_and_each_rows_speedups() -> None:
    base = trial(5, BASELINE, role="baseline")
    everywhere = frozenset(offered_by_bucket(BASELINE, OBJECTIVE))
    table = compose(
        base,
        {Option("tree/ll128", None): (everywhere, measured(times({s: 1.2 for s in LARGE})))},
        BASELINE,
        OBJECTIVE,
        nodes=NODES,
        ranks=RANKS,
    )
    assert table is not None and table.base == 5
    (row,) = table.rows
    assert (round(row.speedup, 6), row.base_speedup, row.bucket.name) == (1.2, 1.0, "16M-4G")


def test_bases_are_searched_configurations_best_per_order() -> None:
    natural = trial(0, BASELINE, role="baseline", value=1.0)
    racks_first = trial(1, BASELINE, order="racks", value=0.9)
    racks_best = trial(2, BASELINE, order="racks", role="candidate", value=1.2)
    pruned = trial(3, BASELINE, order="hostname", value=None)
    pruned = StoredTrial(**{**pruned.__dict__, "value": None, "measurements": BASELINE})
    table = trial(4, BASELINE, order="optimized", role="table", value=2.0)
    assert [b.number for b in bases([natural, racks_first, racks_best, pruned, table], BASELINE, OBJECTIVE)] == [2, 0]


def test_a_configuration_strong_everywhere_but_one_bucket_is_also_a_base_of_its_order() -> None:
    # The order's best by value wins the large bucket; the other configuration wins 64K-1M and 1M-16M but
    # loses the large one: lifted to the order's best there (ln 1.3 + ln 1.3 + ln 2), it would beat the best
    # with one of its own buckets lifted (ln 1.3 + ln 2). A row may do just that.
    best = trial(1, measured(times({s: 2.0 for s in LARGE})), value=1.26)
    lopsided_speedups = {**{s: 1.3 for s in (*MID, 4 * MIB, 16 * MIB)}, **{s: 1.1 for s in LARGE}}
    lopsided = trial(2, measured(times(lopsided_speedups)), env={"NCCL_NTHREADS": "128"}, value=1.22)
    # Behind the best wherever the best is not at its own order's best: lifting one bucket is not enough.
    weak_speedups = {**{s: 0.95 for s in SIZES}, **{s: 1.05 for s in LARGE}}
    weak = trial(3, measured(times(weak_speedups)), env={"NCCL_NTHREADS": "64"}, value=0.99)
    assert [b.number for b in bases([best, lopsided, weak], BASELINE, OBJECTIVE)] == [1, 2]
    assert [b.number for b in bases([best, weak], BASELINE, OBJECTIVE)] == [1]
    # Rescues are per order: a configuration of another order is never lifted to this order's best.
    other = StoredTrial(**{**lopsided.__dict__, "rank_order": "racks"})
    assert [b.number for b in bases([best, other, weak], BASELINE, OBJECTIVE)] == [1, 2]


def test_the_plan_uses_search_winners_for_channel_options_and_skips_failed_options() -> None:
    natural = trial(0, BASELINE, role="baseline", value=1.0)
    winner = forced(1, 8, {s: 1.2 for s in LARGE}, role="candidate")
    winner = StoredTrial(**{**winner.__dict__, "rank_order": "racks", "params": {"order": "racks"}, "value": 1.5})
    # A table trial is no search winner: its count (16) is not an option.
    table = StoredTrial(**{**forced(2, 16, {s: 1.5 for s in LARGE}).__dict__, "role": "table", "params": {"t": 1}})
    sampled = forced(3, 2, {s: 1.2 for s in MID}, role="sampled")
    sampled = StoredTrial(**{**sampled.__dict__, "params": {"s": 1}, "value": 0.9})
    searched = [natural, winner, table, sampled]
    planned, _ = plan_next(searched, BASELINE, OBJECTIVE, nodes=NODES, ranks=RANKS)
    assert not [p for p in planned if p.key.endswith("channels=16")]
    assert [p.key for p in planned if p.key.startswith("option:0:channels")] == [
        "option:0:channels=2",
        "option:0:channels=8",
    ], "candidates' and sampled trials' counts, one bucket each: the smaller first"
    mine = [p for p in planned if p.base == 0]
    assert all(p.params == natural.params for p in mine), "an option runs its base's configuration"
    (channel,) = [p for p in mine if p.key == "option:0:channels=8"]
    assert {r[3:] for r in rows_of(channel.table)} == {(None, None, 8)}
    assert {r[1] for r in rows_of(channel.table)} == {65537, MIB + 1, 16 * MIB + 1}, "every weighted bucket"
    # The racks base comes first (1.5x) and every one of its options failed; of the natural base's, one failed
    # and ring/LL128 won the tree-sized bucket.
    done = []
    for i, p in enumerate(planned):
        if p.base == 1 or p.key == "option:0:tree/ll":
            done.append(trial(10 + i, None, role=p.role, key=p.key, table=p.table, finished=True))
        else:
            scale = {s: 1.2 for s in MID} if p.key == "option:0:ring/ll128" else {}
            done.append(trial(10 + i, measured(times(scale)), role=p.role, key=p.key, table=p.table))
    planned, pending = plan_next([*searched, *done], BASELINE, OBJECTIVE, nodes=NODES, ranks=RANKS)
    (composed,) = planned
    assert (composed.key, composed.params, pending) == ("per_size:0", natural.params, False)


# Two collectives and two kinds of weight: all_gather weighs half, and so does 64K-1M (per collective: all_reduce
# 0.5, 1, 1 over 64K-1M, 1M-16M, 16M-4G; all_gather 0.25, 0.5, 0.5). Sums below are weighted log sums.
TWO = Objective(WorkloadProfile({"all_reduce": 1.0, "all_gather": 0.5}, {"0-1K": 0.0, "1K-64K": 0.0, "64K-1M": 0.5}))
BASELINE_TWO = Measurements(BASELINE.samples + measured(times(), collective="all_gather").samples)
NTHREADS = {"NCCL_NTHREADS": "256"}
OTHER = {"NCCL_NTHREADS": "128"}


def _two(
    number: int,
    all_reduce: tuple[float, float, float],
    all_gather: tuple[float, float, float],
    *,
    channels: int | None = 16,
    env: Mapping[str, str] = NTHREADS,
    value: float = 1.1,
) -> StoredTrial:
    """A searched trial measured at these speedups in 64K-1M, 1M-16M and 16M-4G, per collective."""

    def scale(speedups: tuple[float, float, float]) -> dict[int, float]:
        mid, medium, large = speedups
        return {**{s: mid for s in MID}, 4 * MIB: medium, 16 * MIB: medium, **{s: large for s in LARGE}}

    samples = measured(times(scale(all_reduce))).samples
    samples += measured(times(scale(all_gather)), collective="all_gather").samples
    forced = {} if channels is None else {"NCCL_MIN_CTAS": str(channels), "NCCL_MAX_CTAS": str(channels)}
    return trial(number, Measurements(samples), env={**env, **forced}, value=value)


# The order's best by value: 16 channels, 2x at both 16M-4G buckets (1.5 ln 2 = 1.040).
BEST_TWO = _two(1, (1.0, 1.0, 2.0), (1.0, 1.0, 2.0), value=1.3)


def rescues(*trials: StoredTrial, best: StoredTrial = BEST_TWO) -> list[int]:
    return [b.number for b in bases([best, *trials], BASELINE_TWO, TWO)][1:]


def test_channel_rows_lift_a_configuration_to_a_smaller_count_of_the_same_environment() -> None:
    # 64 channels: faster than the best at all_reduce 64K-1M and 1M-16M, slow at both 16M-4G buckets. A
    # 16-channel row gives it the best's 2x there: 0.5 ln 1.3 + ln 1.3 + 1.5 ln 2 = 1.433. The bar is the best
    # with its weakest bucket lifted (all_reduce 1M-16M to 1.3): ln 1.3 + 1.5 ln 2 = 1.302.
    assert rescues(_two(2, (1.3, 1.3, 1.1), (1.0, 1.0, 1.1), channels=64)) == [2]
    # Under NCCL's own channel count a forced count is a row too.
    assert rescues(_two(3, (1.3, 1.3, 1.1), (1.0, 1.0, 1.1), channels=None)) == [3]
    # 8 channels: a row cannot raise its count to 16, so one row lifts one bucket (all_reduce 16M-4G, the
    # heavier): 1.134. The best, with 8-channel rows, would be 1.433.
    assert rescues(_two(4, (1.3, 1.3, 1.1), (1.0, 1.0, 1.1), channels=8)) == []
    # 64 channels of another environment: the 16-channel measurement is not what its row would run.
    assert rescues(_two(5, (1.3, 1.3, 1.1), (1.0, 1.0, 1.1), channels=64, env=OTHER)) == []


def test_channel_rows_lift_to_the_fastest_measurement_of_that_count_and_no_further() -> None:
    # The 16-channel configuration measured again, slower (1.5x at 16M-4G): the row is worth the faster run.
    again = _two(2, (1.0, 1.0, 1.5), (1.0, 1.0, 1.5), value=1.25)
    assert rescues(again, _two(3, (1.3, 1.3, 1.1), (1.0, 1.0, 1.1), channels=64)) == [3]
    # Only what was measured, below NCCL's defaults too: the best runs all_gather 64K-1M at 0.9x, so a row gives
    # the 64-channel configuration 0.9x there, not 1x; it is then the best with all_reduce 64K-1M at 1.3x, the
    # bar itself, and no rescue.
    slow_mid = _two(1, (1.0, 1.0, 2.0), (0.9, 1.0, 2.0), value=1.3)
    assert rescues(_two(2, (1.3, 0.9, 1.1), (0.5, 1.0, 1.1), channels=64), best=slow_mid) == []
    # A configuration's own repeats are no row: a row only lowers the count. Together these two runs would
    # sum 1.433 with one row; the first alone sums 1.134.
    first = _two(2, (1.3, 1.3, 1.1), (1.0, 1.0, 1.1), channels=64, env=OTHER, value=1.2)
    repeat = _two(3, (1.0, 1.0, 1.1), (1.0, 1.0, 2.0), channels=64, env=OTHER, value=1.15)
    assert rescues(first, repeat) == []


def test_a_repeat_of_the_best_configuration_is_never_a_rescue() -> None:
    # Measured faster again (1.433 > 1.302): still the configuration that is already a base.
    assert rescues(_two(2, (1.3, 1.3, 2.0), (1.0, 1.0, 2.0), value=1.2)) == []
    assert rescues(_two(3, (1.3, 1.3, 2.0), (1.0, 1.0, 2.0), env=OTHER, value=1.2)) == [3]


def test_a_configuration_rows_would_make_only_as_fast_as_the_best_is_no_rescue() -> None:
    assert rescues(_two(2, (1.0, 1.0, 2.0), (1.0, 1.0, 2.0), env=OTHER)) == []


def test_a_rescue_lifts_the_bucket_where_it_falls_furthest_behind_weighing_each_bucket() -> None:
    # No smaller count of its environment was measured, so one row. all_reduce 16M-4G falls furthest once
    # all_gather's half weight counts (ln(2/1.6) = 0.223 against 0.5 ln(2/1.3) = 0.215; unweighted,
    # all_gather's would): lifted there the sum is 0.5 ln 1.55 + ln 1.3 + ln 2 + 0.5 ln 1.3 = 1.305 > 1.302 (the
    # bar: all_reduce 1M-16M lifted), a rescue; with all_gather's lifted instead it would be 1.298.
    assert rescues(_two(2, (1.55, 1.3, 1.6), (1.0, 1.0, 1.3), env=OTHER)) == [2]
    # all_reduce 16M-4G falls furthest once 64K-1M's half weight counts (0.223 against 0.5 ln(1/0.7) = 0.178;
    # unweighted, 64K-1M would): lifted there 0.5 ln 0.7 + ln 1.22 + 1.5 ln 2 + 0.5 ln 1.5 = 1.263 > 1.243 (the
    # bar: all_gather 1M-16M lifted to 1.5x), a rescue; with 64K-1M lifted instead it would be 1.218.
    assert rescues(_two(3, (0.7, 1.22, 1.6), (1.0, 1.5, 2.0), env=OTHER)) == [3]


def test_a_rescue_is_lifted_only_to_the_orders_best_measurement_and_in_one_bucket() -> None:
    # Both 16M-4G buckets lifted to the order's 2x it would sum 1.433; one row lifts one: 1.087 < 1.302.
    assert rescues(_two(2, (1.3, 1.3, 1.0), (1.0, 1.0, 1.0), env=OTHER)) == []
    # Lifted to the 2x measured there, never beyond.
    assert rescues(_two(3, (1.3, 1.0, 1.9), (1.0, 1.0, 1.6), env=OTHER)) == []


def test_the_rescue_is_the_one_lifted_highest_and_the_first_measured_on_a_tie() -> None:
    first = _two(2, (1.3, 1.3, 1.1), (1.0, 1.0, 1.1), channels=64)  # 1.433
    tie = _two(3, (1.3, 1.3, 1.1), (1.0, 1.0, 1.1), channels=None)  # 1.433, measured later
    assert rescues(tie, first) == [2]
    # Ranked last by value, highest with one row (all_reduce 16M-4G): 1.678; the two above, with theirs
    # (all_reduce 1M-16M to 1.6), 1.641.
    highest = _two(4, (1.4, 1.6, 1.1), (1.0, 1.0, 2.0), channels=None, env=OTHER, value=1.0)
    assert rescues(first, tie, highest) == [4]
