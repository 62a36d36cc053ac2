"""Static checks of the Dockerfile (no Docker engine needed): stages, bases, users, entry points.

The file is parsed with `dockerfile`, a binding to BuildKit's own parser, so what is checked here is what
`docker build` would see. What cannot be checked without building (that the images start) is not claimed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import dockerfile
import pytest
import yaml
from packaging.requirements import Requirement

from tests.deploy.chart_render import CHART_DIR, REPO_ROOT

VENV = "/opt/topo-tune"
ENTRYPOINT = [f"{VENV}/bin/topo-tune"]


@dataclass(frozen=True)
class Stage:
    name: str
    base: str  # after substituting the global ARG defaults
    commands: tuple[dockerfile.Command, ...]

    def runs(self) -> list[str]:
        return [" ".join(c.value) for c in self.commands if c.cmd == "RUN"]

    def last(self, instruction: str) -> dockerfile.Command:
        found = [c for c in self.commands if c.cmd == instruction]
        assert found, f"stage {self.name} has no {instruction}"
        return found[-1]

    def copies_from(self) -> list[tuple[str, tuple[str, ...]]]:
        """(source stage, paths) of every COPY --from=STAGE."""
        result = []
        for command in self.commands:
            if command.cmd != "COPY":
                continue
            for flag in command.flags:
                if flag.startswith("--from="):
                    result.append((flag.removeprefix("--from="), command.value))
        return result


def _substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def _parse() -> tuple[dict[str, str], list[Stage]]:
    commands = dockerfile.parse_file(str(REPO_ROOT / "Dockerfile"))
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    current: list[dockerfile.Command] = []
    header: tuple[str, str] | None = None
    for command in commands:
        if command.cmd == "FROM":
            if header is not None:
                stages.append(Stage(name=header[0], base=header[1], commands=tuple(current)))
            image, *rest = command.value
            assert [word.upper() for word in rest[:1]] == ["AS"], f"unnamed stage: {command.original}"
            header = (rest[1], _substitute(image, global_args))
            current = []
        elif header is None and command.cmd == "ARG":
            name, _, default = command.value[0].partition("=")
            global_args[name] = default
        else:
            current.append(command)
    assert header is not None, "the Dockerfile has no FROM"
    stages.append(Stage(name=header[0], base=header[1], commands=tuple(current)))
    return global_args, stages


GLOBAL_ARGS, STAGES = _parse()
BY_NAME = {stage.name: stage for stage in STAGES}


def _chain(name: str) -> list[Stage]:
    """The stage and every stage it is built from or copies from, transitively."""
    seen: list[Stage] = []
    pending = [name]
    while pending:
        stage = BY_NAME[pending.pop()]
        if stage in seen:
            continue
        seen.append(stage)
        if stage.base in BY_NAME:
            pending.append(stage.base)
        pending.extend(source for source, _ in stage.copies_from())
    return seen


def _values() -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return loaded


def test_stages_and_default_target() -> None:
    assert [stage.name for stage in STAGES] == [
        "wheel",
        "controller-venv",
        "agent-build",
        "agent",
        "controller",
    ]
    # `docker build .` without --target builds the last stage: the small controller image.
    assert STAGES[-1].name == "controller"
    for stage in STAGES:
        for source, _ in stage.copies_from():
            assert STAGES.index(BY_NAME[source]) < STAGES.index(stage), f"{stage.name} copies from a later stage"


def test_controller_image_has_no_torch_and_no_cuda() -> None:
    assert BY_NAME["controller"].base.startswith("python:3.11-slim")
    for stage in _chain("controller"):
        assert "cuda" not in stage.base and "pytorch" not in stage.base, stage.name
        for run in stage.runs():
            assert "torch" not in run and "[agent]" not in run, f"{stage.name}: {run}"
    installs = " ".join(BY_NAME["controller-venv"].runs())
    assert "[postgres]" in installs, "the controller image must reach PostgreSQL"


def test_agent_image_has_torch_on_a_cuda_base() -> None:
    assert BY_NAME["agent"].base.startswith("nvidia/cuda:")
    assert "-runtime-" in BY_NAME["agent"].base
    installs = " ".join(BY_NAME["agent-build"].runs())
    assert '"torch==${TORCH_VERSION}"' in installs
    assert "[agent]" in installs
    agent_extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (torch,) = [Requirement(spec) for spec in agent_extra["agent"] if spec.startswith("torch")]
    assert torch.specifier.contains(GLOBAL_ARGS["TORCH_VERSION"]), "the pinned torch must satisfy the agent extra"


def test_virtual_environments_are_copied_between_identical_bases() -> None:
    # A venv's scripts name its interpreter by absolute path: copying it onto another base breaks them.
    for stage in STAGES:
        for source, paths in stage.copies_from():
            if VENV in paths:
                assert BY_NAME[source].base == stage.base, f"{stage.name} copies {VENV} from {source}"
                assert paths == (VENV, VENV)


def test_both_images_run_topo_tune() -> None:
    for name in ("controller", "agent"):
        stage = BY_NAME[name]
        entrypoint = stage.last("ENTRYPOINT")
        assert entrypoint.json, f"{name}: shell-form ENTRYPOINT would swallow SIGTERM"
        assert list(entrypoint.value) == ENTRYPOINT
        assert any(paths == (VENV, VENV) for _, paths in stage.copies_from()), name
        assert stage.last("CMD").value[0] == name


def test_controller_runs_as_the_charts_non_root_user() -> None:
    user = BY_NAME["controller"].last("USER").value[0]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric non-root UID, so that runAsNonRoot can verify it"
    controller = _values()["controller"]
    assert isinstance(controller, dict)
    assert int(uid) == controller["podSecurityContext"]["runAsUser"]
    assert int(gid) == controller["podSecurityContext"]["runAsGroup"]
    assert f"--uid {uid}" in " ".join(BY_NAME["controller"].runs())


def test_agent_runs_as_root_as_the_chart_expects() -> None:
    assert BY_NAME["agent"].last("USER").value[0] == "0:0"
    agent = _values()["agent"]
    assert isinstance(agent, dict)
    assert agent["securityContext"]["runAsUser"] == 0
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_exposed_ports_are_the_charts_ports() -> None:
    exposed = {int(port) for port in BY_NAME["controller"].last("EXPOSE").value}
    controller = _values()["controller"]
    assert isinstance(controller, dict)
    assert exposed == set(controller["ports"].values())


def test_agent_image_builds_the_nccl_tuner_plugin() -> None:
    build = [run for run in BY_NAME["agent-build"].runs() if "topo-tune plugin build" in run]
    assert len(build) == 1, "one clearly labelled `topo-tune plugin build` step in agent-build"
    assert build[0].startswith(f"{VENV}/bin/topo-tune plugin build --output {VENV}/lib ")
    assert "if " not in build[0], "unconditional: a plugin that does not compile must fail the image build"
    compilers = " ".join(BY_NAME["agent-build"].runs())
    assert " gcc " in compilers and "libc6-dev" in compilers  # build.py looks for cc, gcc or clang
    # The plugin lands inside the venv, which the agent stage copies whole.
    assert ("agent-build", (VENV, VENV)) in BY_NAME["agent"].copies_from()


def _context_copies(stage: Stage) -> list[tuple[str, str]]:
    """(source, destination) of the stage's COPY instructions that read the build context."""
    pairs = []
    for command in stage.commands:
        if command.cmd == "COPY" and not any(flag.startswith("--from=") for flag in command.flags):
            *sources, destination = command.value
            pairs.extend((source, destination) for source in sources)
    return pairs


def test_the_wheel_both_images_install_carries_the_whole_package(tmp_path: Path) -> None:
    # Replays the wheel stage on what its COPY instructions take from the build context, offline, and
    # checks that every tracked file of the package ships: a file missing from package-data (a migration,
    # the tuner plugin's C sources) would be missing from both images.
    stage = BY_NAME["wheel"]
    workdir = tmp_path / stage.last("WORKDIR").value[0].lstrip("/")
    for source, destination in _context_copies(stage):
        target = workdir / destination / Path(source).name if destination.endswith("/") else workdir / destination
        if (REPO_ROOT / source).is_dir():
            shutil.copytree(REPO_ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / source, target)
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    result = subprocess.run(
        [*build, "--wheel-dir", str(wheels), str(workdir)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = wheels.glob("topo_tune-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
        entry_points = archive.read(next(n for n in shipped if n.endswith("entry_points.txt"))).decode()
    tracked = subprocess.run(
        ["git", "ls-files", "topo_tune"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked
    assert sorted(set(tracked) - shipped) == [], "tracked package files missing from the wheel"
    # ENTRYPOINT runs the console script; it must exist under this name.
    assert "topo-tune = topo_tune.cli.main:main" in entry_points


def _docker_ignored(path: str, rules: list[str]) -> bool:
    """Docker's .dockerignore semantics: the last matching rule wins; a rule matching a parent applies."""
    ignored = False
    parts = path.split("/")
    for rule in rules:
        negated = rule.startswith("!")
        pattern = rule.removeprefix("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


def test_build_context_holds_what_copy_needs_and_nothing_else() -> None:
    rules = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [
        path
        for stage in STAGES
        for command in stage.commands
        if command.cmd == "COPY" and not any(flag.startswith("--from=") for flag in command.flags)
        for path in command.value[:-1]
    ]
    assert sources, "no COPY from the build context"
    for source in sources:
        assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not _docker_ignored(source, rules), f"COPY {source}: excluded by .dockerignore"
    for path in ("topo_tune/__init__.py", "pyproject.toml"):
        assert not _docker_ignored(path, rules), path
    for path in (
        ".git/config",
        ".venv/bin/python",
        "tests/deploy/test_dockerfile.py",
        "topo_tune/__pycache__/x.pyc",
    ):
        assert _docker_ignored(path, rules), f"{path} would be sent to the builder"


@pytest.mark.parametrize("name", ["controller", "agent"])
def test_images_write_no_bytecode_and_log_unbuffered(name: str) -> None:
    env: dict[str, str] = {}
    for command in BY_NAME[name].commands:
        if command.cmd == "ENV":  # the parser yields (key, value, key, value, ...)
            env.update(zip(command.value[::2], command.value[1::2], strict=True))
    assert env["PYTHONUNBUFFERED"] == "1"  # logs reach `kubectl logs` as they are written
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # the root filesystem is read-only in the chart
    assert env["PATH"].startswith(f"{VENV}/bin:")


def test_the_plugin_build_step_runs_as_written(tmp_path: Path) -> None:
    # Replays the agent-build RUN line with this checkout's CLI and a temporary output directory, so the
    # command, its flags and the library name the step checks for are the real ones.
    (step,) = [run for run in BY_NAME["agent-build"].runs() if "topo-tune plugin build" in run]
    command = step.replace(f"{VENV}/bin/topo-tune", f"{sys.executable} -m topo_tune").replace(
        f"{VENV}/lib", str(tmp_path / "lib")
    )
    result = subprocess.run(["bash", "-ec", command], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in (tmp_path / "lib").iterdir()] == ["libnccl-tuner-topotune.so"]
