"""A job's arm is a pure function of the version and the job id: the same on every rank, in every process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from topo_tune.errors import ConfigError
from topo_tune.ids import ConfigVersionId
from topo_tune.learning.assignment import (
    CHOSEN_ARM,
    JOB_OPT_OUT_ENV,
    MAX_EXPLORE_SHARE,
    Exploration,
    LearningSwitches,
    assign_arm,
    job_opted_out,
)

VERSION = ConfigVersionId("cv-3f2a9c0d11e4")
ON = LearningSwitches(cluster_enabled=True)
EXPLORE = Exploration(VERSION, challengers=3, share=0.2)
JOBS = [f"slurm-{n}" for n in range(20_000)]

# One simulated rank: a fresh interpreter that assigns every job in its own (shuffled) order.
_RANK = """
import json, random, sys
from topo_tune.ids import ConfigVersionId
from topo_tune.learning.assignment import Exploration, LearningSwitches, assign_arm
jobs, seed = json.loads(sys.stdin.read())
order = list(range(len(jobs)))
random.Random(seed).shuffle(order)
exploration = Exploration(ConfigVersionId("cv-3f2a9c0d11e4"), challengers=3, share=0.2)
arms = [0] * len(jobs)
for i in order:
    arms[i] = assign_arm(exploration, jobs[i], switches=LearningSwitches(cluster_enabled=True), job_env={})
print(json.dumps(arms))
"""


def _rank_process(jobs: list[str], *, start_seed: int, hash_seed: str) -> list[int]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", _RANK],
        input=json.dumps([jobs, start_seed]),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    arms: list[int] = json.loads(done.stdout)
    return arms


def test_every_simulated_rank_assigns_every_job_the_same_arm_whatever_its_start_order_and_hash_seed() -> None:
    jobs = JOBS[:2000]
    expected = [assign_arm(EXPLORE, j, switches=ON, job_env={}) for j in jobs]
    ranks = [
        _rank_process(jobs, start_seed=rank, hash_seed=hash_seed) for rank, hash_seed in enumerate(("0", "1", "4242"))
    ]
    for rank, arms in enumerate(ranks):
        assert arms == expected, f"rank {rank} disagrees with this process on some job's arm"
    assert set(expected) == {0, 1, 2, 3}, "the sample reaches the chosen table and every challenger"


def test_the_arm_is_fixed_for_the_job_and_independent_of_how_often_or_in_which_order_it_is_asked() -> None:
    shuffled = JOBS[:500]
    first = {j: assign_arm(EXPLORE, j, switches=ON, job_env={}) for j in shuffled}
    random.Random(7).shuffle(shuffled)
    for job in shuffled * 2:
        assert assign_arm(EXPLORE, job, switches=ON, job_env={}) == first[job]


def test_the_share_of_jobs_on_challengers_is_bounded_and_the_challengers_share_it_evenly() -> None:
    counts = Counter(assign_arm(EXPLORE, j, switches=ON, job_env={}) for j in JOBS)
    n, share = len(JOBS), EXPLORE.share
    explored = n - counts[CHOSEN_ARM]
    sigma = (n * share * (1 - share)) ** 0.5
    assert abs(explored - n * share) < 4 * sigma, f"{explored} of {n} jobs explored, expected about {n * share:.0f}"
    per_arm = n * share / EXPLORE.challengers
    for arm in (1, 2, 3):
        assert abs(counts[arm] - per_arm) < 4 * (per_arm**0.5), f"challenger {arm}: {counts[arm]} jobs"


def test_a_new_version_draws_anew_so_no_job_id_is_stuck_exploring() -> None:
    other = Exploration(ConfigVersionId("cv-0000aaaa1111"), challengers=3, share=0.2)
    same = sum(
        assign_arm(EXPLORE, j, switches=ON, job_env={}) == assign_arm(other, j, switches=ON, job_env={})
        for j in JOBS[:5000]
    )
    # Independent draws agree on about 0.8^2 + 3 * (0.2 / 3)^2 = 65% of jobs; the same draw would agree on all.
    assert 0.60 * 5000 < same < 0.70 * 5000


@pytest.mark.parametrize(
    ("switches", "job_env", "why"),
    [
        (LearningSwitches(), {}, "the cluster's switch is off by default"),
        (LearningSwitches(cluster_enabled=True, version_stopped=True), {}, "the version's kill switch"),
        (ON, {JOB_OPT_OUT_ENV: "off"}, "the job opted out"),
        (ON, {JOB_OPT_OUT_ENV: " OFF\n"}, "the opt-out ignores case and blanks"),
    ],
)
def test_every_switch_keeps_every_job_on_the_chosen_table(
    switches: LearningSwitches, job_env: dict[str, str], why: str
) -> None:
    assert all(assign_arm(EXPLORE, j, switches=switches, job_env=job_env) == CHOSEN_ARM for j in JOBS[:3000]), why


def test_only_off_opts_out() -> None:
    assert job_opted_out({JOB_OPT_OUT_ENV: "off"})
    assert not job_opted_out({JOB_OPT_OUT_ENV: "on"}) and not job_opted_out({})
    explored = sum(assign_arm(EXPLORE, j, switches=ON, job_env={JOB_OPT_OUT_ENV: "0"}) != 0 for j in JOBS[:3000])
    assert explored > 0, "an unknown value is not an opt-out"


def test_a_version_without_challengers_or_with_a_zero_share_never_explores() -> None:
    for exploration in (Exploration(VERSION, challengers=0, share=0.3), Exploration(VERSION, challengers=2, share=0)):
        assert {assign_arm(exploration, j, switches=ON, job_env={}) for j in JOBS[:3000]} == {CHOSEN_ARM}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"version": ConfigVersionId(""), "challengers": 1, "share": 0.1}, "version"),
        ({"version": VERSION, "challengers": -1, "share": 0.1}, "challengers"),
        ({"version": VERSION, "challengers": 1, "share": MAX_EXPLORE_SHARE + 0.01}, "share"),
        ({"version": VERSION, "challengers": 1, "share": -0.1}, "share"),
    ],
)
def test_a_bad_exploration_is_refused_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Exploration(**kwargs)  # type: ignore[arg-type]
    assert refused.value.field == field


def test_a_job_without_an_id_is_refused() -> None:
    with pytest.raises(ConfigError, match="job_id"):
        assign_arm(EXPLORE, "", switches=ON, job_env={})
