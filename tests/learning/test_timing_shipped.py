"""A learning job's timing records: written by the real plugin's profiler (driven by ``profiler_driver.c`` in
place of NCCL) under ``topo-tune exec``, shipped with the job's own credential when the command ends, stored
whole or not at all, and refused with the field named when they do not belong to the job."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tests.learning.learning_cluster import LEARNING, NODE, learning_cluster
from tests.learning.test_job_arm import SHARE, expected_arm
from tests.plugin.conftest import plugin_library_path as plugin_library_path  # noqa: PLC0414 - a fixture
from tests.plugin.test_profiler_timing import driver as driver  # noqa: PLC0414 - the session fixture
from tests.support.processes import TOKEN, cli_env
from topo_tune.client.admin import AdminClient
from topo_tune.client.credential_entries import IssuedRole
from topo_tune.config.cluster import LearningConfig
from topo_tune.errors import PermissionDenied, ValidationError
from topo_tune.plugin.timing_record import TIMING_MAGIC

LEARNING_ON = LearningConfig(enabled=True, explore_share=SHARE, timing_sample=3)
# The job: where exec names a profiler, the driver plays NCCL's events through it; then the job fails.
JOB = '[ -z "$NCCL_PROFILER_PLUGIN" ] || "$DRIVER" "$NCCL_PROFILER_PLUGIN" 5 12 1 > /dev/null; env > "$ENV_OUT"; exit 3'


def _exec(address: str, token: str, *, job_id: str, config_dir: Path, plugin: Path, driver: Path, tmp: Path,
          **extra: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = [sys.executable, "-m", "topo_tune", "exec", "--job-id", job_id, "--nodes", NODE, "--node", NODE]
    argv += ["--config-dir", str(config_dir), "--tuner-plugin", str(plugin), "--", "sh", "-c", JOB]
    (tmp / "tmp").mkdir(exist_ok=True)
    environ = cli_env(
        TOPO_TUNE_CONTROLLER=address, DRIVER=str(driver), ENV_OUT=str(tmp / f"{job_id}.env"), TMPDIR=str(tmp / "tmp")
    )
    environ.update(TOPO_TUNE_TOKEN=token, **extra)
    return subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=120, check=False)


async def test_exec_ships_the_records_of_a_learning_job_with_its_own_credential(
    sqlite_url: str, tmp_path: Path, plugin_library_path: Path, driver: Path
) -> None:
    explorer = next(f"job-{i}" for i in range(64) if expected_arm(f"job-{i}") == 1)
    async with learning_cluster(sqlite_url, tmp_path, learning=LEARNING_ON) as cluster:
        with AdminClient(cluster.address, token=TOKEN) as admin:
            job_token = (await asyncio.to_thread(admin.issue_credential, IssuedRole.JOB)).token

        def run(job_id: str, **extra: str) -> subprocess.CompletedProcess[str]:
            return _exec(cluster.address, job_token, job_id=job_id, config_dir=cluster.config_dir,
                         plugin=plugin_library_path, driver=driver, tmp=tmp_path, **extra)  # fmt: skip

        done = await asyncio.to_thread(run, explorer)
        assert done.returncode == 3, "the job's own exit status stands"
        assert f"shipped 1 timing records of job {explorer} (1 new)" in done.stderr, done.stderr
        env = dict(
            line.split("=", 1) for line in (tmp_path / f"{explorer}.env").read_text().splitlines() if "=" in line
        )
        assert env["NCCL_TUNER_CONFIG_FILE"].endswith(f"{LEARNING.id}/nccl_tuner.challenger-1.conf")
        assert env["TOPO_TUNE_LEARNING_ARM"] == "1" and env["TOPO_TUNE_TIMING_SAMPLE"] == "3"
        assert not list((tmp_path / "tmp").iterdir()), "exec removes the directory it made for the records"

        stored = await cluster.controller.services.job_timings.of_version(LEARNING.id)
        assert [(s.job_id, s.arm, s.node) for s in stored] == [(explorer, 1, NODE)]
        assert stored[0].record.arm == 1 and {c.collective for c in stored[0].record.cells} == {
            "allreduce",
            "allgather",
        }

        opted = await asyncio.to_thread(run, "job-opted-out", TOPO_TUNE_LEARNING="off")
        assert opted.returncode == 3 and "shipped" not in opted.stderr
        env = (tmp_path / "job-opted-out.env").read_text()
        assert "NCCL_PROFILER_PLUGIN" not in env and "TOPO_TUNE_LEARNING_ARM" not in env
        assert len(await cluster.controller.services.job_timings.of_version(LEARNING.id)) == 1


async def test_records_are_refused_naming_the_field_and_stored_all_or_none(sqlite_url: str, tmp_path: Path) -> None:
    explorer = next(f"job-{i}" for i in range(64) if expected_arm(f"job-{i}") == 1)
    record = (
        f"{TIMING_MAGIC}\nprocess h:1 comm abc rank {{rank}} nranks 2 nnodes 1 sample 3 arm {{arm}}\n"
        "unfinished 0 overflow 0\nallreduce 1024 ring/ll 6 2 10000 5000 5000 17.0 145.0\n"
    )
    async with learning_cluster(sqlite_url, tmp_path, learning=LEARNING_ON) as cluster:
        with AdminClient(cluster.address, token=TOKEN) as admin:
            owner = (await asyncio.to_thread(admin.issue_credential, IssuedRole.JOB)).token
            other = (await asyncio.to_thread(admin.issue_credential, IssuedRole.JOB)).token
        timings = cluster.controller.services.job_timings

        def call(token: str, job_id: str, records: list[str]) -> int:
            with AdminClient(cluster.address, token=token) as client:
                client.resolve_job_config(job_id, [NODE], may_learn=True)
                return client.record_job_timing(job_id, NODE, records)

        good = [record.format(rank=0, arm=1), record.format(rank=1, arm=1)]
        with pytest.raises(ValidationError, match=r"records\[1\]\.arm: 0 is not the arm pinned for the job \(1\)"):
            await asyncio.to_thread(call, owner, explorer, [good[0], record.format(rank=1, arm=0)])
        with pytest.raises(ValidationError, match=r"records\[1\]: line 4: expected '<collective> <bytes>"):
            await asyncio.to_thread(call, owner, explorer, [good[0], good[1].replace("allreduce 1024", "allreduce")])
        assert await timings.of_version(LEARNING.id) == [], "a refused call stores nothing"
        assert await asyncio.to_thread(call, owner, explorer, good) == 2
        assert await asyncio.to_thread(call, owner, explorer, good) == 0, "a retry stores nothing new"
        with pytest.raises(PermissionDenied, match="belongs to another credential"):
            await asyncio.to_thread(call, other, explorer, good)
        with AdminClient(cluster.address, token=TOKEN) as admin:
            await asyncio.to_thread(admin.resolve_job_config, "job-not-learning", [NODE])
            with pytest.raises(ValidationError, match="job_id: job 'job-not-learning' does not learn"):
                await asyncio.to_thread(admin.record_job_timing, "job-not-learning", NODE, good)
            with pytest.raises(ValidationError, match=r"records: 513 records, at most 512"):
                await asyncio.to_thread(admin.record_job_timing, explorer, NODE, [good[0]] * 513)
        assert len(await timings.of_version(LEARNING.id)) == 2
