"""The arm schedule of ``exec --compare``: derived from the job id alone, the same in every process, balanced."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from topo_tune.errors import ConfigError
from topo_tune.jobs.compare.schedule import Arm, arm_schedule

JOB_IDS = [f"job-{n}" for n in range(40)] + ["4242", "slurm.123_4", "x" * 253]


@pytest.mark.parametrize("pairs", [2, 3, 4, 7, 10])
def test_every_pair_runs_each_arm_once_and_each_arm_runs_pairs_times(pairs: int) -> None:
    for job_id in JOB_IDS:
        runs = arm_schedule(job_id, pairs)
        assert [r.index for r in runs] == list(range(2 * pairs))
        assert [r.pair for r in runs] == [i // 2 for i in range(2 * pairs)]
        for pair in range(pairs):
            assert {r.arm for r in runs if r.pair == pair} == {Arm.CANDIDATE, Arm.AGAINST}
        firsts = [runs[2 * p].arm for p in range(pairs)]
        # ABBA blocks: the second pair of a block mirrors the first, so each arm leads half the pairs.
        for block in range(pairs // 2):
            assert firsts[2 * block + 1] is firsts[2 * block].other
        leads = firsts.count(Arm.CANDIDATE)
        assert pairs // 2 <= leads <= (pairs + 1) // 2


def test_the_job_id_chooses_which_arm_leads_each_block() -> None:
    leads = {arm_schedule(job_id, 8)[0].arm for job_id in JOB_IDS}
    assert leads == {Arm.CANDIDATE, Arm.AGAINST}
    patterns = {tuple(r.arm for r in arm_schedule(job_id, 8)) for job_id in JOB_IDS}
    assert len(patterns) > 4  # four blocks, each led by either arm: not one fixed pattern for every job


def test_separate_processes_with_different_hash_seeds_derive_the_same_schedule() -> None:
    code = (
        "from topo_tune.jobs.compare.schedule import arm_schedule\n"
        "print(''.join(r.arm.value[0] for job in ('a', 'job-7', '4242') for r in arm_schedule(job, 9)))"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        outputs.add(done.stdout.strip())
    expected = "".join(r.arm.value[0] for job in ("a", "job-7", "4242") for r in arm_schedule(job, 9))
    assert outputs == {expected}


@pytest.mark.parametrize(
    ("job_id", "pairs", "flag"), [("", 4, "--job-id"), ("j", 1, "--pairs"), ("j", 1001, "--pairs")]
)
def test_bad_input_names_the_flag(job_id: str, pairs: int, flag: str) -> None:
    with pytest.raises(ConfigError, match=f"^{flag}: "):
        arm_schedule(job_id, pairs)
