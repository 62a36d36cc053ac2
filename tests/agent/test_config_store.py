"""The node's config store: validation before writing, atomic activation, rollback, retention, crash safety."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.config_store_child import A, B
from topo_tune.agent.command_executor import CommandExecutor
from topo_tune.agent.config_store import ConfigStore, check_version, jobs_lock_shared
from topo_tune.agent.journal import Journal
from topo_tune.errors import ConflictError, StoreBusy, ValidationError
from topo_tune.nccl.backends import Backend
from topo_tune.v1 import agent_pb2
from topo_tune.versions.version import ConfigVersion, render_nccl_conf, version_id

CHILD = Path(__file__).with_name("config_store_child.py")
ROOT_DIR = Path(__file__).resolve().parent.parent.parent


def version(**settings: str) -> ConfigVersion:
    return ConfigVersion({"nccl.conf": render_nccl_conf(settings)})


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.fixture
def store(tmp_path: Path) -> ConfigStore:
    return ConfigStore(tmp_path / "config")


def test_apply_stages_and_activates_a_version(store: ConfigStore) -> None:
    applied = store.apply(A.id, A.files)
    assert (applied.version, applied.previous, applied.changed) == (A.id, "", True)
    assert store.active_version() == A.id
    assert (store.root / "active" / "nccl.conf").read_text() == A.files["nccl.conf"]
    assert store.path_of(A.id).read_text() == A.files["nccl.conf"]
    assert store.read(A.id) == dict(A.files)


def test_applying_the_active_version_again_changes_nothing(store: ConfigStore) -> None:
    store.apply(A.id, A.files)
    before = {p: p.lstat().st_mtime_ns for p in store.root.rglob("*")}
    again = store.apply(A.id, A.files, busy=lambda: "a benchmark is running")  # a no-op is allowed even when busy
    assert not again.changed
    assert {p: p.lstat().st_mtime_ns for p in store.root.rglob("*")} == before


def test_rollback_returns_to_the_kept_previous_version(store: ConfigStore) -> None:
    store.apply(A.id, A.files)
    store.apply(B.id, B.files)
    back = store.apply(A.id, A.files)
    assert (back.previous, store.active_version()) == (B.id, A.id)
    assert (store.root / "active" / "nccl_tuner.conf").read_text() == A.files["nccl_tuner.conf"]


def test_deactivating_returns_the_node_to_nccls_defaults(store: ConfigStore) -> None:
    store.apply(A.id, A.files)
    assert store.apply("", {}).previous == A.id
    assert store.active_version() == ""
    assert not (store.root / "active").exists()
    assert store.staged() == [A.id]  # still there for a rollback


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("../escape.conf", "files['../escape.conf']"),
        ("/etc/nccl.conf", "files['/etc/nccl.conf']"),
        ("..", "files['..']"),
        ("sub/nccl.conf", "files['sub/nccl.conf']"),
        ("libevil.so", "files['libevil.so']"),
    ],
)
def test_file_names_that_leave_the_directory_are_refused_before_any_write(
    store: ConfigStore, name: str, field: str
) -> None:
    files = {name: "NCCL_MIN_CTAS=4\n"}
    with pytest.raises(ValidationError) as caught:
        store.apply(version_id(files), files)
    assert caught.value.field == field
    assert not store.root.exists()
    assert not (store.root.parent / "escape.conf").exists()


@pytest.mark.parametrize(
    "settings",
    [
        {"LD_PRELOAD": "/tmp/evil.so"},
        {"NCCL_NET_PLUGIN": "/tmp/evil.so"},
        {"NCCL_TUNER_PLUGIN": "/tmp/evil.so"},
        {"NCCL_PROTO": "LL128"},
        {"NCCL_P2P_LEVEL": "SYS"},
        {"NCCL_GRAPH_FILE": "/tmp/graph.xml"},
        {"NCCL_CONF_FILE": "/tmp/other.conf"},
        {"NCCL_IB_TIMEOUT": "0"},
    ],
)
def test_only_allow_listed_nccl_variables_are_accepted(store: ConfigStore, settings: dict[str, str]) -> None:
    files = {"nccl.conf": render_nccl_conf(settings)}
    with pytest.raises(ValidationError) as caught:
        store.apply(version_id(files), files)
    assert next(iter(settings)) in caught.value.field
    assert not store.root.exists()


def test_a_version_id_that_is_not_the_hash_of_its_files_is_refused(store: ConfigStore) -> None:
    with pytest.raises(ValidationError, match="not the hash"):
        store.apply(A.id, B.files)
    with pytest.raises(ValidationError, match="version"):
        check_version("../../etc", A.files)
    assert not store.root.exists()


def test_a_planted_symlink_at_a_version_path_is_replaced_not_followed(store: ConfigStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store.root.mkdir()
    (store.root / "versions").mkdir()
    (store.root / "versions" / A.id).symlink_to(outside)
    store.apply(A.id, A.files)
    assert list(outside.iterdir()) == []
    staged = store.root / "versions" / A.id
    assert staged.is_dir() and not staged.is_symlink()
    assert store.read(A.id) == dict(A.files)


def test_an_active_pointer_aimed_outside_is_not_trusted(store: ConfigStore, tmp_path: Path) -> None:
    store.apply(A.id, A.files)
    (store.root / "active").unlink()
    (store.root / "active").symlink_to(tmp_path)
    with pytest.raises(ConflictError, match="not at a staged version"):
        store.active_version()


def test_a_staged_version_changed_on_disk_is_staged_again(store: ConfigStore) -> None:
    store.apply(A.id, A.files)
    store.apply(B.id, B.files)
    store.path_of(A.id).chmod(0o644)
    store.path_of(A.id).write_text("NCCL_MIN_CTAS=64\n")
    with pytest.raises(ConflictError, match="does not match"):
        store.read(A.id)
    store.apply(A.id, A.files)
    assert store.read(A.id) == dict(A.files)


def test_a_busy_node_is_not_changed(store: ConfigStore) -> None:
    store.apply(A.id, A.files)
    with pytest.raises(StoreBusy, match="benchmark running"):
        store.apply(B.id, B.files, busy=lambda: "benchmark running")
    assert store.active_version() == A.id
    assert B.id not in store.staged()


def test_a_running_job_holding_the_jobs_lock_blocks_a_change(store: ConfigStore) -> None:
    store.apply(A.id, A.files)
    fd = jobs_lock_shared(store.root)
    assert fd is not None
    try:
        with pytest.raises(StoreBusy, match="a job"):
            store.apply(B.id, B.files)
    finally:
        os.close(fd)
    assert store.apply(B.id, B.files).changed


def test_retention_keeps_the_newest_versions_and_always_the_active_and_previous(store: ConfigStore) -> None:
    small = ConfigStore(store.root, keep=3)
    versions = [version(NCCL_MIN_CTAS=str(n)) for n in range(1, 8)]
    for v in versions:
        small.apply(v.id, v.files)
    assert small.staged()[-2:] == [versions[-2].id, versions[-1].id]
    assert len(small.staged()) == 3
    # Going back to an old version makes it the newest; the one it replaced stays for the next rollback.
    small.apply(versions[-2].id, versions[-2].files)
    assert set(small.staged()) >= {versions[-1].id, versions[-2].id}


STEPS = ["wrote nccl.conf", "wrote nccl_tuner.conf", "staged", "renamed", "linked", "swapped", "activated"]


def _child(*args: str) -> list[str]:
    return [sys.executable, str(CHILD), *args]


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT_DIR)}


def assert_one_whole_version_active(root: Path, allowed: set[str] | None = None) -> str:
    store = ConfigStore(root)
    store.recover()
    active = store.active_version()
    if allowed is not None:
        assert active in allowed
    files = store.read(active)  # the hash check: every file of exactly that version, nothing else
    for name, content in files.items():
        assert (root / "active" / name).read_text() == content
    assert not [p for p in (root / "versions").iterdir() if p.name.startswith(".")], "recover left debris"
    return active


@pytest.mark.faults
@pytest.mark.parametrize("step", STEPS)
def test_an_apply_killed_at_each_step_leaves_the_old_or_the_new_version_whole(tmp_path: Path, step: str) -> None:
    root = tmp_path / "config"
    ConfigStore(root).apply(A.id, A.files)
    done = subprocess.run(_child(str(root), "step", step), env=_child_env(), capture_output=True, check=False)
    assert done.returncode == -9, done.stderr.decode()
    active = assert_one_whole_version_active(root, {A.id, B.id})
    assert active == (B.id if step in ("swapped", "activated") else A.id)
    # The next apply after the crash completes normally.
    assert ConfigStore(root).apply(B.id, B.files).version == B.id
    assert_one_whole_version_active(root, {B.id})


@pytest.mark.faults
def test_an_agent_killed_at_random_moments_mid_apply_never_leaves_a_mix(tmp_path: Path) -> None:
    root = tmp_path / "config"
    rng = random.Random(7)
    seen: set[str] = set()
    for attempt in range(12):
        child = subprocess.Popen(
            _child(str(root), "loop", str(attempt * 1000)), env=_child_env(), stdout=subprocess.PIPE
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        try:
            child.wait(timeout=rng.uniform(0.005, 0.06))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        child.stdout.close()
        assert child.returncode == -9
        if (root / "active").is_symlink():
            seen.add(assert_one_whole_version_active(root))
    assert len(seen) >= 2, "the kills never landed after a swap; the test proves nothing"


def test_a_tampered_active_version_is_reported_and_applying_it_again_repairs_it(store: ConfigStore) -> None:
    store.apply(A.id, A.files)
    assert store.damage() == ""
    # What NCCL_DEBUG=WARN NCCL_DEBUG_FILE=<config dir>/active/nccl.conf did before job files were confined.
    active_conf = store.root / "active" / "nccl.conf"
    active_conf.chmod(0o644)
    active_conf.write_text("host:1:1 [0] NCCL WARN something\n")
    assert "does not match its id" in store.damage()
    with pytest.raises(StoreBusy):
        store.apply(A.id, A.files, busy=lambda: "a benchmark is running")
    repaired = store.apply(A.id, A.files)
    assert (repaired.version, repaired.previous, repaired.changed) == (A.id, A.id, True)
    assert active_conf.read_text() == A.files["nccl.conf"]
    assert store.damage() == ""
    assert not store.apply(A.id, A.files).changed


def test_a_file_added_to_the_active_version_is_damage_too(store: ConfigStore) -> None:
    store.apply(A.id, A.files)
    (store.root / "active" / "topo-dump.xml").write_text("<system/>")  # NCCL_TOPO_DUMP_FILE's old reach
    assert "does not match its id" in store.damage()
    store.apply(A.id, A.files)
    assert sorted(p.name for p in (store.root / "active").iterdir()) == sorted(A.files)


def test_no_active_version_is_no_damage(store: ConfigStore) -> None:
    assert store.damage() == ""
    store.apply("", {})
    assert store.damage() == ""


def test_a_job_naming_a_changed_staged_version_is_rejected_before_it_runs(store: ConfigStore, tmp_path: Path) -> None:
    store.apply(A.id, A.files)
    executor = CommandExecutor(journal=Journal(tmp_path / "journal.db"), config_store=store, backend=Backend.SIM)
    pinned = str(store.path_of(A.id))
    assert store.damage_of_file(pinned) == ""
    assert store.damage_of_file(str(store.root / "active" / "nccl.conf")) == ""
    assert store.damage_of_file("/etc/nccl.conf") == ""  # not a staged version: the env policy's business
    store.path_of(A.id).write_text("NCCL_PROTO=LL128\n")  # what NCCL_DEBUG_FILE or an operator could do
    for conf in (pinned, str(store.root / "active" / "nccl.conf")):
        command = agent_pb2.Command(
            command_id="gate-1", run_benchmark=agent_pb2.RunBenchmark(job_id="gate-1", env={"NCCL_CONF_FILE": conf})
        )
        result = asyncio.run(executor.run(command))
        assert result.status == agent_pb2.COMMAND_STATUS_REJECTED
        assert (
            result.message
            == f"NCCL_CONF_FILE: staged version {A.id} does not match its id; it was changed after staging"
        )
