"""A job's arm reaches every rank and communicator as one table, and the plugin then chooses alike everywhere.

Simulated ranks of a job, each with two communicators, are created in a shuffled order; each binds the table
its job's arm names (``NCCL_TUNER_CONFIG_FILE``, as the job's environment sets it) and is asked about the
same bins (merged tasks arrive as one bin at their summed size). Every context must make the same choice for
every bin, and the arm must matter where its table differs.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.plugin.nccl_tuner_harness import ALLREDUCE, RING, SIMPLE, TREE, TunerLibrary, nccl_like_table
from topo_tune.ids import ConfigVersionId
from topo_tune.learning.assignment import Exploration, LearningSwitches, assign_arm

HEADER = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\n"
CHOSEN = HEADER + "allreduce,0,65536,ring,ll,4,1,4\nallreduce,1048577,16777216,ring,simple,16,1,4\n"
CHALLENGER = HEADER + "allreduce,0,65536,ring,ll,4,1,4\nallreduce,1048577,16777216,tree,simple,16,1,4\n"
# Bins: single calls, and tasks NCCL merged (same function, op and type within 4x) at their summed size.
BINS = [1024, 32768, 3 * 1024 * 1024, 1_000_000 + 2_000_000 + 3_000_000, 8 << 20, 200_000]
RANKS, COMMS = 4, 2


def choices(tuner: TunerLibrary, table: Path, monkeypatch: pytest.MonkeyPatch, *, seed: int) -> set[tuple[object, ...]]:
    """Every context's (bin, choice, channels) sequence, the contexts started in a shuffled order."""
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(table))
    starts = [(rank, comm) for rank in range(RANKS) for comm in range(COMMS)]
    random.Random(seed).shuffle(starts)
    seen = set()
    for _rank, comm in starts:
        context = tuner.init(5, n_ranks=RANKS, n_nodes=1, comm_id=0xC0 + comm)
        sequence = []
        for size in BINS:
            cost = nccl_like_table()
            channels = context.coll_info(ALLREDUCE, size, cost)
            sequence.append((size, cost.nccl_choice(), channels))
        seen.add(tuple(sequence))
    return seen


def test_every_rank_and_communicator_of_a_job_chooses_alike_and_the_arm_decides_what(
    tuner: TunerLibrary, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = [tmp_path / "chosen.csv", tmp_path / "challenger.csv"]
    tables[0].write_text(CHOSEN)
    tables[1].write_text(CHALLENGER)
    exploration = Exploration(ConfigVersionId("cv-77aa"), challengers=1, share=0.5)
    on = LearningSwitches(cluster_enabled=True)
    by_arm: dict[int, tuple[object, ...]] = {}
    for n in range(12):
        job = f"job-{n}"
        arm = assign_arm(exploration, job, switches=on, job_env={})
        (sequence,) = choices(tuner, tables[arm], monkeypatch, seed=n)  # one sequence: all 8 contexts agree
        assert by_arm.setdefault(arm, sequence) == sequence, f"{job}: the same arm chose differently"
        tuner.finalize_all()
    assert set(by_arm) == {0, 1}, "the twelve jobs reach both arms"
    differ = [a[0] for a, b in zip(by_arm[0], by_arm[1], strict=True) if a != b]
    assert differ == [3 * 1024 * 1024, 6_000_000, 8 << 20], (
        "the arms differ exactly in the bucket the challenger changes"
    )
    assert {c for size, c, _ in by_arm[1] if size in differ} == {(TREE, SIMPLE)}
    assert {c for size, c, _ in by_arm[0] if size in differ} == {(RING, SIMPLE)}
