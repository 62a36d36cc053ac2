"""A version may carry a challenger table only where the proof showed it non-inferior in every bucket it changes."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from topo_tune.errors import TunerTableError
from topo_tune.learning.candidates import admit_challenger, changed_buckets
from topo_tune.tuner.objective import DEFAULT_BUCKETS
from topo_tune.tuner.proof import BucketProof, FinalistProof
from topo_tune.tuner.space import RankOrder, TrialConfig
from topo_tune.tuner.statistics import Bounds, compare

MAX_LOSS = 0.02
ORDER = RankOrder("natural", ("a", "b"))
ENV = {"NCCL_MIN_CTAS": "16", "NCCL_MAX_CTAS": "16"}
HEADER = "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n"
CHOSEN_TABLE = HEADER + "allreduce,0,1024,ring,ll,-1,2,16\nallreduce,16777217,4294967295,ring,simple,-1,2,16\n"
# Changes 1M-16M only (a row there), and leaves the chosen rows alone.
CHALLENGER_TABLE = CHOSEN_TABLE + "allreduce,1048577,16777216,tree,ll128,-1,2,16\n"
SAME_SPEED = (1.0, 0.99, 1.01)


def proof(
    trial: int, table: str, bounds: Mapping[str, tuple[float, float, float]], *, env: Mapping[str, str] = ENV
) -> FinalistProof:
    """A finalist whose all_reduce bucket ``name`` has (point, lower, upper) speedup; unnamed buckets: no change."""
    buckets = []
    for b in DEFAULT_BUCKETS:
        point, low, high = bounds.get(b.name, SAME_SPEED)
        measured = Bounds(low, high, faster=low > 1.03, decided_at=10, estimate=point)
        comparison = compare([100.0] * 3, [100.0 / point] * 3)
        buckets.append(BucketProof("all_reduce", b, comparison, measured.decision(MAX_LOSS), measured, 1.0))
    return FinalistProof(
        trial, TrialConfig(env=env, rank_order=ORDER, tuner_table=table), 1.2, tuple(buckets), 1.1, None, None
    )


CHOSEN = proof(1, CHOSEN_TABLE, {"16M-4G": (1.2, 1.15, 1.25)})


def test_the_changed_buckets_are_where_the_rows_differ_and_only_there() -> None:
    changed, outside = changed_buckets(CHOSEN_TABLE, CHALLENGER_TABLE, buckets=DEFAULT_BUCKETS)
    assert changed == [("allreduce", "1M-16M")] and outside == []
    changed, _ = changed_buckets(CHOSEN_TABLE, HEADER + "allreduce,0,1024,ring,ll,-1,2,16\n", buckets=DEFAULT_BUCKETS)
    assert changed == [("allreduce", "16M-4G")], "a dropped row changes its bucket back to NCCL's choice"
    spanning = CHOSEN_TABLE + "allgather,60000,70000,ring,simple,8,2,16\n"
    changed, _ = changed_buckets(CHOSEN_TABLE, spanning, buckets=DEFAULT_BUCKETS)
    assert changed == [("allgather", "1K-64K"), ("allgather", "64K-1M")], "a row over a boundary changes both"
    reordered = HEADER + "\n".join(reversed(CHOSEN_TABLE.splitlines()[1:])) + "\n"
    assert changed_buckets(CHOSEN_TABLE, reordered, buckets=DEFAULT_BUCKETS) == ([], []), "order counts per bucket"
    shadowed = HEADER + "allreduce,0,1024,tree,ll,-1,2,16\n" + CHOSEN_TABLE.split("\n", 1)[1]
    assert changed_buckets(CHOSEN_TABLE, shadowed, buckets=DEFAULT_BUCKETS)[0] == [("allreduce", "0-1K")]


def test_a_challenger_safe_in_every_bucket_it_changes_and_close_to_the_chosen_one_is_admitted() -> None:
    challenger = proof(2, CHALLENGER_TABLE, {"16M-4G": (1.2, 1.15, 1.25), "1M-16M": (1.05, 1.0, 1.1)})
    admission = admit_challenger(CHOSEN, challenger, max_loss=MAX_LOSS)
    assert admission.admitted, admission.refusals
    assert admission.changed == (("allreduce", "1M-16M"),) and admission.challenger == 2


@pytest.mark.parametrize(
    ("bounds", "words"),
    [
        ((0.99, 0.95, 1.03), "not shown safe against NCCL's defaults"),
        ((0.9, 0.85, 0.95), "slower against NCCL's defaults"),
    ],
)
def test_a_challenger_with_a_changed_bucket_not_shown_non_inferior_is_refused_naming_it(
    bounds: tuple[float, float, float], words: str
) -> None:
    challenger = proof(2, CHALLENGER_TABLE, {"16M-4G": (1.2, 1.15, 1.25), "1M-16M": bounds})
    admission = admit_challenger(CHOSEN, challenger, max_loss=MAX_LOSS)
    assert not admission.admitted
    assert [r.split(":")[0] for r in admission.refusals] == ["allreduce 1M-16M"]
    assert words in admission.refusals[0]


def test_an_unsafe_bucket_the_challenger_does_not_change_is_not_held_against_it() -> None:
    # The challenger's own measurement of 0-1K was noisy, but its table runs exactly the chosen rows there.
    challenger = proof(2, CHALLENGER_TABLE, {"0-1K": (0.99, 0.9, 1.05), "1M-16M": (1.0, 0.99, 1.01)})
    assert admit_challenger(CHOSEN, challenger, max_loss=MAX_LOSS).admitted


def test_a_challenger_safe_against_the_defaults_but_far_below_the_chosen_table_is_refused() -> None:
    # Both safe against NCCL's defaults in 16M-4G, but the chosen one is 20% faster there: a job on the
    # challenger could lose far more than maxLoss against what it would otherwise have run.
    chosen = proof(1, CHOSEN_TABLE, {"16M-4G": (1.2, 1.15, 1.25)})
    challenger = proof(2, HEADER + "allreduce,0,1024,ring,ll,-1,2,16\n", {"16M-4G": (1.0, 0.99, 1.01)})
    admission = admit_challenger(chosen, challenger, max_loss=MAX_LOSS)
    assert not admission.admitted
    assert admission.refusals[0].startswith("allreduce 16M-4G: may lose 20.8% against the chosen table")


def test_a_changed_bucket_the_proof_did_not_test_is_refused() -> None:
    challenger = proof(2, CHALLENGER_TABLE, {"1M-16M": (1.05, 1.0, 1.1)})
    unweighed = FinalistProof(
        challenger.trial,
        challenger.config,
        challenger.search_value,
        tuple(
            BucketProof(
                b.collective, b.bucket, b.comparison, b.decision, b.bounds, 0.0 if b.bucket.name == "1M-16M" else 1.0
            )
            for b in challenger.buckets
        ),
        challenger.speedup,
        None,
        None,
    )
    refusals = admit_challenger(CHOSEN, unweighed, max_loss=MAX_LOSS).refusals
    assert refusals == (
        "allreduce 1M-16M: its table changes this bucket, but the proof did not test it (a bucket weighed 0)",
    )


def test_a_challenger_whose_environment_differs_or_whose_proof_failed_or_that_changes_nothing_is_refused() -> None:
    other_env = proof(2, CHALLENGER_TABLE, {"1M-16M": (1.05, 1.0, 1.1)}, env={"NCCL_MIN_CTAS": "8"})
    assert "an arm swaps only the table" in admit_challenger(CHOSEN, other_env, max_loss=MAX_LOSS).refusals[0]
    same = proof(3, CHOSEN_TABLE, {})
    assert admit_challenger(CHOSEN, same, max_loss=MAX_LOSS).refusals == (
        "its table chooses exactly as the chosen one does: nothing to learn",
    )
    beyond = proof(4, CHOSEN_TABLE.replace("4294967295", "8589934592"), {})
    refusals = admit_challenger(CHOSEN, beyond, max_loss=MAX_LOSS).refusals
    assert refusals == (
        "allreduce 4294967296-18446744073709551615: its table changes sizes outside every bucket the proof measured",
    )


def test_a_malformed_challenger_table_is_refused_naming_the_line() -> None:
    with pytest.raises(TunerTableError, match="challenger table:2"):
        changed_buckets(CHOSEN_TABLE, HEADER + "allreduce,0,x,ring,ll,-1,2,16\n", buckets=DEFAULT_BUCKETS)
