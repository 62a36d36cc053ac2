"""Files a user names are written whole or not at all, never through a symlink, their mode kept
(``security/safe_write.py``), and ``workload import --write`` writes its file and backup that way."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import run_cli
from topo_tune.cli.local_cluster import token_file_for
from topo_tune.errors import FileWriteError
from topo_tune.security import safe_write
from topo_tune.security.safe_write import SECRET_FILE_MODE, stage_file, write_file

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "workload"
RANKS = [FIXTURES / f"ddp_gloo_rank{r}.json.gz" for r in (0, 1)]
CLUSTER = """\
apiVersion: topo-tune/v1
backend: sim
workload:
  collectives: {all_reduce: 1}
racks:
  - name: r0
    nodes:
      - {name: n0, gpus: 8}
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    previous = os.umask(0o000)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file elsewhere that a planted symlink points at: it must never change."""
    path = tmp_path / "elsewhere" / "victim"
    path.parent.mkdir()
    path.write_text("precious\n")
    return path


def test_a_new_file_gets_the_stated_mode_whatever_the_umask(permissive_umask: None, tmp_path: Path) -> None:
    write_file(tmp_path / "report.html", "<p>")
    write_file(tmp_path / "agent.token", "secret\n", new_mode=SECRET_FILE_MODE)
    write_file(tmp_path / "blob", b"\x00\xff")
    assert (mode(tmp_path / "report.html"), mode(tmp_path / "agent.token")) == (0o644, 0o600)
    assert (tmp_path / "agent.token").read_text() == "secret\n" and (tmp_path / "blob").read_bytes() == b"\x00\xff"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.token", "blob", "report.html"]  # no scratch left


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("old")
    path.chmod(0o600)
    write_file(path, "new")  # the default for new files (0644) does not widen it
    assert (path.read_text(), mode(path)) == ("new", 0o600)
    path.chmod(0o640)
    write_file(path, "newer", new_mode=0o600)
    assert (path.read_text(), mode(path)) == ("newer", 0o640)
    write_file(path, "forced", mode=0o600)
    assert mode(path) == 0o600


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_a_symlink_at_the_target_is_refused_and_its_target_untouched(
    tmp_path: Path, victim: Path, dangling: bool
) -> None:
    link = tmp_path / "out.txt"
    link.symlink_to(victim if not dangling else tmp_path / "missing")
    with pytest.raises(FileWriteError, match=r"out\.txt: is a symbolic link; refusing to write through it") as caught:
        write_file(link, "attacker-controlled")
    assert str(caught.value).startswith(str(link)) and "\n" not in str(caught.value)
    assert victim.read_text() == "precious\n" and link.is_symlink() and not (tmp_path / "missing").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out.txt"]


def test_a_directory_at_the_target_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(FileWriteError, match="not a regular file"):
        write_file(tmp_path / "out", "x")


def test_a_symlink_planted_at_the_scratch_name_is_never_followed(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scratch name is random; an attacker who guessed it still gets O_EXCL | O_NOFOLLOW: the write fails.
    monkeypatch.setattr(safe_write.secrets, "token_hex", lambda n: "guessed")
    target = tmp_path / "out.txt"
    target.write_text("old")
    (tmp_path / ".out.txt.guessed.partial").symlink_to(victim)
    with pytest.raises(FileWriteError, match=r"out\.txt: cannot write in its directory: File exists"):
        write_file(target, "new")
    assert victim.read_text() == "precious\n" and target.read_text() == "old"


def test_the_scratch_name_is_random(tmp_path: Path) -> None:
    first, second = stage_file(tmp_path / "a", "1"), stage_file(tmp_path / "a", "2")
    assert first.scratch != second.scratch and first.scratch.parent == tmp_path
    first.discard()
    second.commit()
    assert [p.name for p in tmp_path.iterdir()] == ["a"] and (tmp_path / "a").read_text() == "2"


def test_a_write_that_fails_half_way_leaves_the_old_file_and_no_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cluster.yaml"
    target.write_text("old content\n")
    real_write = os.write
    calls = 0

    def write_then_fail(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError(28, "No space left on device")
        return real_write(fd, bytes(data[:4]))  # a short write first: the rest must follow

    monkeypatch.setattr(safe_write.os, "write", write_then_fail)
    with pytest.raises(FileWriteError, match=r"cluster\.yaml: cannot write it: No space left on device"):
        write_file(target, "new content that is longer\n")
    assert calls == 2 and target.read_text() == "old content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.yaml"]
    monkeypatch.undo()

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(safe_write.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_file(target, "new")
    assert target.read_text() == "old content\n" and [p.name for p in tmp_path.iterdir()] == ["cluster.yaml"]


def test_a_short_write_is_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    monkeypatch.setattr(safe_write.os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    write_file(tmp_path / "f", "0123456789")
    assert (tmp_path / "f").read_text() == "0123456789"


# ------------------------------------------------------------------- workload import --write, as a user runs it


def _import_write(config: Path) -> tuple[int, str]:
    result = run_cli("workload", "import", *map(str, RANKS), "--cluster-config", str(config), "--write")
    return result.returncode, result.stderr


def test_workload_write_keeps_a_private_cluster_yaml_private(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(CLUSTER)
    config.chmod(0o600)
    code, stderr = _import_write(config)
    assert code == 0, stderr
    assert "weights:" in config.read_text() and (tmp_path / "cluster.yaml.bak").read_text() == CLUSTER
    assert (mode(config), mode(tmp_path / "cluster.yaml.bak")) == (0o600, 0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "cluster.yaml.bak"]


def test_workload_write_refuses_a_symlink_at_the_backup_and_writes_nothing(tmp_path: Path, victim: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(CLUSTER)
    (tmp_path / "cluster.yaml.bak").symlink_to(victim)
    code, stderr = _import_write(config)
    assert code == 1
    assert stderr.strip() == (
        f"topo-tune: error: {tmp_path / 'cluster.yaml.bak'}: is a symbolic link; refusing to write through it "
        "(remove it, or name its target)"
    )
    assert victim.read_text() == "precious\n" and config.read_text() == CLUSTER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "cluster.yaml.bak", "elsewhere"]


def test_workload_write_refuses_a_symlinked_cluster_yaml(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text(CLUSTER)
    (tmp_path / "cluster.yaml").symlink_to(real)
    code, stderr = _import_write(tmp_path / "cluster.yaml")
    assert code == 1 and "cluster.yaml: is a symbolic link" in stderr and len(stderr.strip().splitlines()) == 1
    assert real.read_text() == CLUSTER and not (tmp_path / "cluster.yaml.bak").exists()


def test_workload_write_ignores_links_at_the_scratch_names_it_used_to_use(tmp_path: Path, victim: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(CLUSTER)
    for name in (".cluster.yaml.workload.tmp", ".cluster.yaml.partial", ".cluster.yaml.bak.partial"):
        (tmp_path / name).symlink_to(victim)
    code, stderr = _import_write(config)
    assert code == 0, stderr
    assert victim.read_text() == "precious\n" and "weights:" in config.read_text()


def test_a_token_file_is_0600_and_never_written_through_a_symlink(tmp_path: Path, victim: Path) -> None:
    wide = tmp_path / "wide.token"
    wide.write_text("x" * 40 + "\n")
    wide.chmod(0o644)  # readable by others: not reused, replaced by a fresh private one
    token = token_file_for(wide)
    assert token != "x" * 40 and wide.read_text() == token + "\n" and mode(wide) == 0o600
    link = tmp_path / "controller.token"
    link.symlink_to(victim)
    with pytest.raises(FileWriteError, match=r"controller\.token: is a symbolic link"):
        token_file_for(link)
    assert victim.read_text() == "precious\n"
