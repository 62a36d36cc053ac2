"""The per-size search: options from what NCCL offered, composed rows, and the plan a study follows."""

from __future__ import annotations

from collections.abc import Mapping

from topo_tune.plugin.table import parse_tuner_table
from topo_tune.tuner.objective import Measurements, Objective, SizeSample, WorkloadProfile
from topo_tune.tuner.size_options import (
    MARGIN,
    ROLE_COMPOSED,
    ROLE_OPTION,
    Option,
    StoredTrial,
    bases,
    compose,
    offered_by_bucket,
    option_table,
    options_for,
    plan_next,
)

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
    assert {p.role for p in planned} == {ROLE_OPTION}
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
    assert ({c.role for c in composed}, sorted(by_base), pending) == ({ROLE_COMPOSED}, [0, 1], False)
    assert rows_of(by_base[0].table) == [("allreduce", 65537, MIB, "ring", "ll128", None)]
    ((collective, low, high, algorithm, protocol, _),) = rows_of(by_base[1].table)
    assert (collective, low, high) == ("allreduce", 65537, MIB), "the large bucket the racks order wins stays NCCL's"
    assert f"{algorithm}/{protocol}" in ALL
    stored = [trial(40 + c.base, measured(times()), role=ROLE_COMPOSED, key=c.key, table=c.table) for c in composed]
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
    # loses the large one: lifted to the order's best there, it would beat the best. A row may do just that.
    best = trial(1, measured(times({s: 2.0 for s in LARGE})), value=1.26)
    lopsided = trial(2, measured(times({**{s: 1.3 for s in (*MID, 4 * MIB, 16 * MIB)}, **{s: 1.1 for s in LARGE}})))
    lopsided = StoredTrial(**{**lopsided.__dict__, "value": 1.22})
    # Behind the best wherever the best is not at its own order's best: lifting one bucket is not enough.
    weak = trial(3, measured(times({**{s: 0.95 for s in SIZES}, **{s: 1.05 for s in LARGE}})), value=0.99)
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


# Bucket weights that differ: 64K-1M weighs half (the rescue weighs each bucket's shortfall by its weight).
HALF_MID = Objective(WorkloadProfile({"all_reduce": 1.0}, {"0-1K": 0.0, "1K-64K": 0.0, "64K-1M": 0.5}))


def _speedups(number: int, mid: float, medium: float, large: float, value: float) -> StoredTrial:
    """A searched trial measured at these speedups in 64K-1M, 1M-16M and 16M-4G."""
    scale = {**{s: mid for s in MID}, 4 * MIB: medium, 16 * MIB: medium, **{s: large for s in LARGE}}
    return trial(number, measured(times(scale)), value=value)


# The order's best: 0.9, 1.0 and 2.0 (weighted log sum 0.5 ln 0.9 + ln 2 = 0.640).
BEST = _speedups(1, 0.9, 1.0, 2.0, value=1.29)


def test_a_rescue_lifts_the_bucket_where_it_falls_furthest_behind_weighing_each_bucket() -> None:
    # 64K-1M falls furthest (0.5 ln(0.9/0.5) = 0.294 against ln(2.0/1.9) = 0.051 at 16M-4G): lifted there to
    # the order's 0.9, it sums 0.852 > 0.640, a rescue. Lifting 16M-4G instead (the first bucket by name) sums
    # 0.609, and would not be one.
    lopsided = _speedups(2, 0.5, 1.3, 1.9, value=1.1)
    assert [b.number for b in bases([BEST, lopsided], BASELINE, HALF_MID)] == [1, 2]
    # Here 16M-4G falls furthest once 64K-1M's half weight counts (ln(2.0/1.6) = 0.223 against
    # 0.5 ln(0.9/0.7) = 0.126; unweighted, 64K-1M would): lifted there it sums 0.681 > 0.640; 64K-1M lifted
    # would sum 0.583.
    weighted = _speedups(3, 0.7, 1.18, 1.6, value=1.1)
    assert [b.number for b in bases([BEST, weighted], BASELINE, HALF_MID)] == [1, 3]


def test_a_rescue_is_lifted_to_the_orders_best_measurement_and_only_one_bucket() -> None:
    # 64K-1M lifted to the order's best there, 0.9 (never to 1.0, which no configuration reached): it sums
    # 0.615 < 0.640, no rescue. Lifted to 1.0 it would sum 0.668; with every bucket lifted, 0.903.
    almost = _speedups(2, 0.4, 1.3, 1.5, value=1.1)
    assert [b.number for b in bases([BEST, almost], BASELINE, HALF_MID)] == [1]


def test_the_rescue_is_the_one_lifted_highest_and_the_first_measured_on_a_tie() -> None:
    second = _speedups(4, 0.7, 1.18, 1.6, value=1.25)  # a rescue (0.681), ranked before the next by value
    highest = _speedups(5, 0.5, 1.3, 1.9, value=1.1)  # lifted higher (0.852)
    again = _speedups(6, 0.5, 1.3, 1.9, value=1.1)  # the same configuration measured again: a tie
    assert [b.number for b in bases([BEST, second, again, highest], BASELINE, HALF_MID)] == [1, 5]
