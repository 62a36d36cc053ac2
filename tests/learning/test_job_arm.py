"""The arm in the job's pin: drawn when a new pin is made and every switch allows, the same for every later
question of the job (whatever a switch says by then), and in the job's environment as its arm's table with the
profiler's variables; a job that does not learn gets exactly the environment it got before learning existed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.learning.learning_cluster import LEARNING, NODE, learning_cluster
from tests.support.processes import TOKEN
from topo_tune.client.admin import AdminClient
from topo_tune.config.cluster import LearningConfig
from topo_tune.jobs.config import LearningPin, job_environment
from topo_tune.jobs.job_config import JobConfig
from topo_tune.jobs.task_prolog import prolog_lines
from topo_tune.learning.assignment import ArmIndex, Exploration, LearningSwitches, assign_arm
from topo_tune.versions.layout import staged_path
from topo_tune.versions.version import TUNER_TABLE, challenger_table

SHARE = 0.5
PLUGIN = Path("/opt/topo-tune/libnccl-tuner-topotune.so")


def expected_arm(job_id: str) -> ArmIndex:
    exploration = Exploration(LEARNING.id, 1, SHARE)
    return assign_arm(exploration, job_id, switches=LearningSwitches(cluster_enabled=True), job_env={})


async def test_a_learning_jobs_pin_carries_its_drawn_arm_for_its_whole_life(sqlite_url: str, tmp_path: Path) -> None:
    learning = LearningConfig(enabled=True, explore_share=SHARE, timing_sample=16)
    async with learning_cluster(sqlite_url, tmp_path, learning=learning) as cluster:
        staged = staged_path(cluster.config_dir, LEARNING.id, challenger_table(1))
        assert staged.read_text() == LEARNING.files[challenger_table(1)], "the agent stages the challengers too"
        with AdminClient(cluster.address, token=TOKEN) as client:

            def ask(job_id: str, *, may_learn: bool = True, arm: str = "") -> JobConfig:
                return client.resolve_job_config(job_id, [NODE], may_learn=may_learn, arm=arm)

            jobs = [f"job-{i}" for i in range(24)]
            answers = {job: await asyncio.to_thread(ask, job) for job in jobs}
            pins = {job: a.learning for job, a in answers.items() if a.config_version == LEARNING.id}
            assert pins == {job: LearningPin(expected_arm(job), 16) for job in jobs}, "every job learns, sampled 1/16"
            assert {pin.arm for pin in pins.values()} == {0, 1}, "some jobs explore, some run the chosen"

            explorer = next(job for job, pin in pins.items() if pin.arm == 1)
            await asyncio.to_thread(client.set_version_learning, LEARNING.id, stopped=True)
            again = await asyncio.to_thread(ask, explorer, may_learn=False)
            assert again.learning == LearningPin(ArmIndex(1), 16), "a pinned job keeps its arm"
            stopped = await asyncio.to_thread(ask, "job-after-the-kill-switch")
            assert stopped.learning is None
            await asyncio.to_thread(client.set_version_learning, LEARNING.id, stopped=False)

            opted_out = await asyncio.to_thread(ask, explorer + "-opted-out", may_learn=False)
            assert opted_out.learning is None, "a job that opted out (or a caller that ships no records) does not learn"
            compared = await asyncio.to_thread(ask, explorer, arm=LEARNING.id)
            assert compared.learning is None, "an arm of exec --compare runs its version's chosen table"

            cluster.controller.services.job_configs.learning = LearningConfig(enabled=False)
            off = await asyncio.to_thread(ask, "job-with-the-cluster-switch-off")
            assert off.learning is None
            resumed = (await asyncio.to_thread(ask, explorer)).learning
            assert resumed is not None and resumed.arm == 1, "pinned before: unchanged"


def test_a_learning_job_runs_its_arms_table_and_is_timed_and_any_other_job_is_as_before(tmp_path: Path) -> None:
    files = sorted(LEARNING.files)
    before = job_environment(LEARNING.id, config_dir=tmp_path, files=files, tuner_plugin=PLUGIN, job_id="j")
    assert before == {
        "TOPO_TUNE_CONFIG_VERSION": LEARNING.id,
        "TOPO_TUNE_JOB_ID": "j",
        "NCCL_CONF_FILE": str(staged_path(tmp_path, LEARNING.id, "nccl.conf")),
        "NCCL_TUNER_PLUGIN": str(PLUGIN),
        "NCCL_TUNER_CONFIG_FILE": str(staged_path(tmp_path, LEARNING.id, TUNER_TABLE)),
    }, "learning off: the environment of a job before learning existed, to the byte"
    for arm, table in ((0, TUNER_TABLE), (1, challenger_table(1))):
        env = job_environment(
            LEARNING.id,
            config_dir=tmp_path,
            files=files,
            tuner_plugin=PLUGIN,
            job_id="j",
            learning=LearningPin(ArmIndex(arm), 16),
        )
        assert env == {
            **before,
            "NCCL_TUNER_CONFIG_FILE": str(staged_path(tmp_path, LEARNING.id, table)),
            "NCCL_PROFILER_PLUGIN": str(PLUGIN),
            "TOPO_TUNE_TIMING_SAMPLE": "16",
            "TOPO_TUNE_LEARNING_ARM": str(arm),
        }


def test_a_slurm_task_prolog_hands_a_job_pinned_with_an_arm_that_arm(tmp_path: Path) -> None:
    # A task prolog does not ask to learn, but a job an exec pinned first runs its arm on every rank.
    env = job_environment(
        LEARNING.id,
        config_dir=tmp_path,
        files=sorted(LEARNING.files),
        tuner_plugin=PLUGIN,
        job_id="j",
        learning=LearningPin(ArmIndex(1), 16),
    )
    lines = prolog_lines(env)
    assert f"export NCCL_TUNER_CONFIG_FILE={staged_path(tmp_path, LEARNING.id, challenger_table(1))}" in lines
    assert "export TOPO_TUNE_LEARNING_ARM=1" in lines
