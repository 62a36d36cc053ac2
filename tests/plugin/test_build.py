"""Building the plugin from the installed package, the ``plugin build`` command, and the job environment."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from topo_tune.cli.main import cli
from topo_tune.plugin import LIBRARY_FILE, SOURCE_FILES, PluginBuildError, build_plugin, find_compiler, plugin_env

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_the_c_source(tmp_path: Path) -> None:
    # Build from a copy so the check sees what setuptools packages, not the working tree.
    project = tmp_path / "project"
    shutil.copytree(REPO / "topo_tune", project / "topo_tune", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, project / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = tmp_path.glob("topo_tune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for source in SOURCE_FILES:
        assert f"topo_tune/plugin/{source}" in names


def test_build_writes_a_loadable_library(tmp_path: Path) -> None:
    built = build_plugin(tmp_path / "lib")

    assert built.path == (tmp_path / "lib" / LIBRARY_FILE).resolve()
    assert ctypes.CDLL(str(built.path)).ncclTunerPlugin_v5
    assert [p.name for p in built.path.parent.iterdir()] == [LIBRARY_FILE], "no partial files left behind"
    assert built.path.stat().st_mode & 0o777 == 0o755


def test_a_symlink_at_the_library_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.so"
    victim.write_bytes(b"another user's library")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / LIBRARY_FILE).symlink_to(victim)
    with pytest.raises(PluginBuildError, match=rf"{LIBRARY_FILE}: is a symbolic link; refusing to write through it"):
        build_plugin(tmp_path / "lib")
    assert victim.read_bytes() == b"another user's library"
    assert [p.name for p in (tmp_path / "lib").iterdir()] == [LIBRARY_FILE]


def test_a_failed_build_names_the_compiler_and_keeps_the_old_library(tmp_path: Path) -> None:
    built = build_plugin(tmp_path)
    before = built.path.read_bytes()
    failing = tmp_path / "failing-cc"
    failing.write_text("#!/bin/sh\necho 'error: the compiler is broken' >&2\nexit 3\n")
    failing.chmod(0o755)

    with pytest.raises(PluginBuildError, match=r"exited with status 3.*\n.*the compiler is broken"):
        build_plugin(tmp_path, environ={**os.environ, "CC": str(failing)})
    assert built.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failing-cc", LIBRARY_FILE]


def test_no_compiler_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PluginBuildError, match=r"no C compiler found .*cc, gcc, clang.*set CC"):
        find_compiler({"PATH": str(tmp_path)})
    with pytest.raises(PluginBuildError, match=r"CC='nope-cc -O1': 'nope-cc' is not an executable"):
        find_compiler({"PATH": str(tmp_path), "CC": "nope-cc -O1"})


def test_cc_may_carry_flags(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None
    assert find_compiler({"PATH": os.environ["PATH"], "CC": f"{cc} -g"}) == (cc, "-g")


def test_cli_build_prints_where_the_library_is(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["plugin", "build", "--output", str(tmp_path / "out")])

    assert result.exit_code == 0, result.output
    library = (tmp_path / "out" / LIBRARY_FILE).resolve()
    assert library.is_file()
    assert f"built {library}" in result.output
    assert f"NCCL_TUNER_PLUGIN={library}" in result.output


def test_cli_build_without_a_compiler_fails_with_the_reason(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["plugin", "build", "--output", str(tmp_path)], env={"CC": "", "PATH": str(tmp_path)}
    )

    assert result.exit_code == 1
    assert "topo-tune: error: no C compiler found" in result.output
    assert not (tmp_path / LIBRARY_FILE).exists()


def test_cli_build_into_an_unusable_directory_names_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(cli, ["plugin", "build", "--output", str(blocker / "sub")])

    assert result.exit_code == 1
    assert f"--output {blocker / 'sub'}: cannot create the directory" in result.output


def test_plugin_env_names_library_and_table() -> None:
    env = plugin_env(Path("/srv/topo-tune/v7/tuner.csv"), Path("/opt/topo-tune/lib/libnccl-tuner-topotune.so"))

    assert env == {
        "NCCL_TUNER_PLUGIN": "/opt/topo-tune/lib/libnccl-tuner-topotune.so",
        "NCCL_TUNER_CONFIG_FILE": "/srv/topo-tune/v7/tuner.csv",
    }


@pytest.mark.parametrize(
    ("table", "library", "named"),
    [("tuner.csv", "/opt/lib.so", "table_path"), ("/srv/tuner.csv", "lib/lib.so", "library_path")],
)
def test_plugin_env_refuses_relative_paths(table: str, library: str, named: str) -> None:
    with pytest.raises(ValueError, match=rf"^{named}: .* must be an absolute path"):
        plugin_env(Path(table), Path(library))
