"""One config per job: the version choice, pinning, the job's environment, and node lists from launchers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from topo_tune.errors import ConfigError, ConflictError
from topo_tune.jobs.config import (
    JobPin,
    RolloutView,
    choose_version,
    expand_hostlist,
    job_environment,
    job_id_from_env,
    nodes_from_env,
    resolve,
    slurm_job_id,
)

OLD, NEW = "cv-00000000000000aa", "cv-00000000000000bb"
MIGRATED = frozenset({"a1", "a2", "b1", "b2"})  # racks a and b are in completed waves; c is not
VIEW = RolloutView(stable_version=OLD, new_version=NEW, migrated_nodes=MIGRATED, rollout_id="ro-1")


def test_a_job_inside_migrated_racks_gets_the_new_version() -> None:
    assert choose_version(["a1", "b2"], VIEW) == NEW


def test_a_job_spanning_a_migrated_and_an_unmigrated_rack_gets_the_previous_version() -> None:
    assert choose_version(["a1", "c1"], VIEW) == OLD


def test_without_a_rollout_every_job_gets_the_stable_version() -> None:
    assert choose_version(["c1"], RolloutView(stable_version=OLD)) == OLD
    assert choose_version(["c1"], RolloutView(stable_version="")) == "", "NCCL's defaults"


def test_a_job_keeps_its_pinned_version_after_a_wave_completes() -> None:
    first = resolve("job-7", ["a1", "c1"], VIEW, {})
    assert first == JobPin("job-7", OLD, ("a1", "c1"))
    later = RolloutView(OLD, NEW, MIGRATED | {"c1", "c2"}, "ro-1")  # rack c completed meanwhile
    assert resolve("job-7", ["c1", "a1"], later, {"job-7": first}).version == OLD
    assert resolve("job-8", ["a1", "c1"], later, {"job-7": first}).version == NEW, "a new job gets the new one"


def test_a_pinned_job_naming_nodes_outside_its_pin_is_refused() -> None:
    pinned = JobPin("job-7", NEW, ("a1", "a2"))
    with pytest.raises(ConflictError, match="c1 may not have it"):
        resolve("job-7", ["a1", "c1"], VIEW, {"job-7": pinned})
    with pytest.raises(ConfigError, match="--job-id"):
        resolve("", ["a1"], VIEW, {})


def test_the_environment_points_at_the_pinned_versions_staged_files(tmp_path: Path) -> None:
    env = job_environment(NEW, config_dir=Path("/etc/nccl/topo-tune"), job_id="job-7")
    assert env == {
        "TOPO_TUNE_CONFIG_VERSION": NEW,
        "TOPO_TUNE_JOB_ID": "job-7",
        "NCCL_CONF_FILE": f"/etc/nccl/topo-tune/versions/{NEW}/nccl.conf",
    }
    with_table = job_environment(
        NEW,
        config_dir=Path("/cfg"),
        files=["nccl.conf", "nccl_tuner.conf"],
        tuner_plugin=Path("/opt/libnccl-tuner-topotune.so"),
    )
    assert with_table["NCCL_TUNER_CONFIG_FILE"] == f"/cfg/versions/{NEW}/nccl_tuner.conf"
    assert with_table["NCCL_TUNER_PLUGIN"] == "/opt/libnccl-tuner-topotune.so"
    assert job_environment("", config_dir=Path("/cfg"))["NCCL_CONF_FILE"] == "/dev/null"
    with_topology = job_environment(NEW, config_dir=Path("/cfg"), files=["nccl.conf", "topology.xml"])
    assert with_topology["NCCL_TOPO_FILE"] == f"/cfg/versions/{NEW}/topology.xml"


@pytest.mark.parametrize(
    ("hostlist", "expected"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
        ("rack[1-2]-n[8-9]", ["rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]),
        ("a, b", ["a", "b"]),
    ],
)
def test_slurm_host_lists_expand(hostlist: str, expected: list[str]) -> None:
    assert expand_hostlist(hostlist) == expected


def test_a_malformed_host_list_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST"):
        expand_hostlist("gpu[01-03")
    with pytest.raises(ConfigError, match="bad range"):
        expand_hostlist("gpu[a-b]")


def test_a_huge_host_list_is_refused_before_it_is_expanded() -> None:
    # gpu[0-99999999] once ran 71 s and took 3.4 GB before a MemoryError; counted first, it is refused at once.
    with pytest.raises(ConfigError, match=r"--nodes: names 100000000 hosts, more than the 100000"):
        expand_hostlist("gpu[0-99999999]", source="--nodes")
    with pytest.raises(ConfigError, match="more than the 100000"):
        expand_hostlist("a[0-999]b[0-999]")  # a product of ranges is counted too
    assert len(expand_hostlist("n[1-100000]")) == 100_000


@pytest.mark.parametrize(
    ("hostlist", "why"),
    [
        ("gpu[5-1]", "runs backwards"),  # once expanded to nothing
        ("gpu[[1-2]]", "brackets"),
        ("gpu]1[", "brackets"),
        ("gpu[1-2]x\nforged", "not a valid node name"),
        ("bad;rm -rf", "not a valid node name"),
    ],
)
def test_a_host_list_that_is_not_one_is_refused_naming_where_it_came_from(hostlist: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as refused:
        expand_hostlist(hostlist, source="--nodes")
    assert str(refused.value).startswith("--nodes: ")


def test_a_node_list_variable_of_names_that_are_not_host_names_is_refused() -> None:
    with pytest.raises(ConfigError, match=re.escape("TOPO_TUNE_NODES: not a valid node name: 'b\\nc'")):
        nodes_from_env({"TOPO_TUNE_NODES": "a,b\nc"})
    with pytest.raises(ConfigError, match=r"SLURM_JOB_NODELIST: .*runs backwards"):
        nodes_from_env({"SLURM_JOB_NODELIST": "gpu[5-1]"})


def test_nodes_and_job_id_come_from_the_launchers_variables() -> None:
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[1-2]"}
    assert (job_id_from_env(slurm), nodes_from_env(slurm)) == (slurm_job_id(slurm), ["gpu1", "gpu2"])
    assert job_id_from_env(slurm).startswith("4242+"), "the id with its allocation's digest"
    explicit = {**slurm, "TOPO_TUNE_JOB_ID": "mine", "TOPO_TUNE_NODES": "x, y"}
    assert (job_id_from_env(explicit), nodes_from_env(explicit)) == ("mine", ["x", "y"])
    assert job_id_from_env({"TORCHELASTIC_RUN_ID": "run-1"}) == "run-1"
    assert nodes_from_env({"TORCHELASTIC_RUN_ID": "run-1"}) == []
