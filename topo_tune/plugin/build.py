"""Compile topo-tune's NCCL tuner plugin from the C source shipped in this package.

The plugin (``topotune_tuner.c``, and its profiler ``topotune_profiler.c`` in the same library) needs no NCCL
or CUDA headers and no libraries beyond libc and libm, so any C11 compiler builds it: ``$CC`` when set, else
the first of ``cc``, ``gcc``, ``clang`` on ``PATH``. The library is written to
``<output>/libnccl-tuner-topotune.so``; NCCL finds it there with ``NCCL_TUNER_PLUGIN`` set to that path, or
with ``NCCL_TUNER_PLUGIN=topotune`` when the directory is on the loader's search path (the profiler, with
``NCCL_PROFILER_PLUGIN`` set to the same path).

Non-goals: cross-compiling, and caching builds (building takes well under a second).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from topo_tune.errors import FileWriteError, PluginBuildError
from topo_tune.security.safe_write import write_file

__all__ = [
    "LIBRARY_FILE",
    "SOURCE_FILES",
    "BuiltPlugin",
    "PluginBuildError",
    "build_plugin",
    "find_compiler",
]

logger = logging.getLogger(__name__)

LIBRARY_FILE = "libnccl-tuner-topotune.so"
"""The file name NCCL derives from ``NCCL_TUNER_PLUGIN=topotune``."""
LIBRARY_MODE = 0o755
"""The library's mode when new: every user's jobs load it (an existing one keeps its own)."""

SOURCE_FILES = (
    "topotune_tuner.c",
    "topotune_profiler.c",
    "nccl_tuner_abi.h",
    "nccl_profiler_abi.h",
    "topotune_record_file.h",
)
"""The package-data files the library is built from: the ``.c`` files are its translation units."""

_COMPILER_CANDIDATES = ("cc", "gcc", "clang")
# -fvisibility=hidden: only the ncclTunerPlugin_vN and ncclProfiler_vN structs are exported, nothing that could
# clash with symbols of NCCL or of the application that loads it.
_CFLAGS = ("-std=c11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra")
_COMPILE_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class BuiltPlugin:
    """A freshly built plugin library."""

    path: Path
    """Absolute path of ``libnccl-tuner-topotune.so``."""
    compiler: tuple[str, ...]
    """The compiler command that built it."""
    diagnostics: str
    """What the compiler printed (warnings); empty for a clean build."""


def find_compiler(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Return the C compiler command: ``$CC`` (split like a shell would) or the first compiler on ``PATH``.

    Raises:
        PluginBuildError: ``$CC`` names nothing runnable, or no compiler is installed.
    """
    search_path = environ.get("PATH", os.defpath)
    configured = environ.get("CC", "").strip()
    if configured:
        command = tuple(shlex.split(configured))
        resolved = shutil.which(command[0], path=search_path)
        if resolved is None:
            raise PluginBuildError(f"CC={configured!r}: {command[0]!r} is not an executable on PATH")
        return (resolved, *command[1:])
    for candidate in _COMPILER_CANDIDATES:
        resolved = shutil.which(candidate, path=search_path)
        if resolved is not None:
            return (resolved,)
    raise PluginBuildError(
        "no C compiler found (tried $CC, then " + ", ".join(_COMPILER_CANDIDATES) + " on PATH); "
        "install one (e.g. the 'gcc' package) or set CC to a C11 compiler"
    )


def build_plugin(output_dir: Path, *, environ: Mapping[str, str] | None = None) -> BuiltPlugin:
    """Compile the plugin into ``output_dir / LIBRARY_FILE`` and return where it is.

    The library is compiled in a private scratch directory, then written beside the target under a random name
    and renamed over it (``safe_write``: a symlink at the target is refused), so a process that already loaded
    an older build keeps its copy intact and a failed build leaves the old one in place.

    Raises:
        PluginBuildError: no compiler, an unusable output directory, or a failed compile (with its output).
    """
    env = dict(os.environ if environ is None else environ)
    compiler = find_compiler(env)
    output_dir = output_dir.expanduser().resolve()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PluginBuildError(f"--output {output_dir}: cannot create the directory ({exc.strerror})") from exc
    if not os.access(output_dir, os.W_OK):
        raise PluginBuildError(f"--output {output_dir}: the directory is not writable")
    target = output_dir / LIBRARY_FILE
    with tempfile.TemporaryDirectory(prefix="topotune-plugin-") as scratch:
        sources = _copy_sources(Path(scratch))
        partial = Path(scratch) / LIBRARY_FILE
        units = [str(source) for source in sources if source.suffix == ".c"]
        # -lm after the sources: the profiler's log times need libm's log().
        command = [*compiler, *_CFLAGS, "-o", str(partial), *units, "-lm"]
        logger.debug("compiling the tuner plugin: %s", shlex.join(command))
        try:
            completed = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=_COMPILE_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PluginBuildError(f"running {shlex.join(compiler)} failed: {exc}") from exc
        diagnostics = (completed.stdout + completed.stderr).strip()
        if completed.returncode != 0:
            raise PluginBuildError(
                f"{shlex.join(compiler)} exited with status {completed.returncode} building {LIBRARY_FILE}:\n"
                f"{diagnostics}"
            )
        try:
            write_file(target, partial.read_bytes(), new_mode=LIBRARY_MODE)
        except FileWriteError as exc:
            raise PluginBuildError(str(exc)) from None
    logger.debug("built %s with %s", target, compiler[0])
    return BuiltPlugin(path=target, compiler=compiler, diagnostics=diagnostics)


def _copy_sources(scratch: Path) -> list[Path]:
    # Copied out of the package so the build works from a zipped install too, and so the header sits
    # next to the source whatever the compiler's include rules.
    package = resources.files(__package__ or "topo_tune.plugin")
    copies = []
    for name in SOURCE_FILES:
        copy = scratch / name
        copy.write_bytes(package.joinpath(name).read_bytes())
        copies.append(copy)
    return copies
