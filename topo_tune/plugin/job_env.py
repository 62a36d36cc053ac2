"""The environment that makes a job's NCCL load topo-tune's tuner plugin with a given table.

``topo-tune exec``/``env`` and the ``nccl`` benchmark backend merge :func:`plugin_env` into the rest of a
job's configuration. Both paths must be absolute: every rank resolves them in its own working directory.

Non-goals: choosing which table a job gets (that is the pinned config version's business) and checking the
table's contents (the plugin reports bad lines through NCCL's log).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "LEARNING_ARM_ENV",
    "PLUGIN_ENV",
    "PROFILER_ENV",
    "TABLE_ENV",
    "TIMING_SAMPLE_ENV",
    "WORKLOAD_ENV",
    "learning_env",
    "plugin_env",
    "workload_env",
]

PLUGIN_ENV = "NCCL_TUNER_PLUGIN"
"""NCCL's variable naming the tuner plugin (a name, a library file or a path)."""

TABLE_ENV = "NCCL_TUNER_CONFIG_FILE"
"""The variable the plugin reads its table path from (the same one NVIDIA's example plugin reads)."""

WORKLOAD_ENV = "TOPO_TUNE_WORKLOAD_DIR"
"""The directory the plugin writes its call counts into at finalize (``topo-tune exec --record-workload``)."""

PROFILER_ENV = "NCCL_PROFILER_PLUGIN"
"""NCCL's variable naming the profiler plugin: the same library as the tuner (it implements both)."""

TIMING_SAMPLE_ENV = "TOPO_TUNE_TIMING_SAMPLE"
"""The profiler times one call in this many, and writes its timing record beside the workload counts."""

LEARNING_ARM_ENV = "TOPO_TUNE_LEARNING_ARM"
"""The job's learning arm, written into the timing record (``docs/learning.md``)."""


def plugin_env(table_path: Path, library_path: Path) -> dict[str, str]:
    """Return ``{NCCL_TUNER_PLUGIN: library_path, NCCL_TUNER_CONFIG_FILE: table_path}``.

    Raises:
        ValueError: a path is relative; the message names which.
    """
    for name, path in (("table_path", table_path), ("library_path", library_path)):
        if not path.is_absolute():
            raise ValueError(f"{name}: {str(path)!r} must be an absolute path, since every rank resolves it itself")
    return {PLUGIN_ENV: str(library_path), TABLE_ENV: str(table_path)}


def workload_env(directory: Path, library_path: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what makes the plugin count the job's calls into ``directory`` (created if needed).

    The plugin is loaded even when the version has no tuner table: without a table it changes nothing and
    only counts. Raises ``ValueError`` when ``directory`` cannot be made.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"cannot create {directory}: {error.strerror or error}") from None
    return {PLUGIN_ENV: str(library_path.absolute()), **env, WORKLOAD_ENV: str(directory.absolute())}


def learning_env(table_path: Path, library_path: Path, *, arm: int, sample: int) -> dict[str, str]:
    """:func:`plugin_env` for the arm's table, plus what makes the same library time the job's calls.

    The timing record needs ``TOPO_TUNE_WORKLOAD_DIR`` too (:func:`workload_env`): the caller names it.
    Raises ``ValueError`` as :func:`plugin_env` does, or for a sample below 1."""
    if sample < 1:
        raise ValueError(f"sample: {sample} must be at least 1 (one call timed in SAMPLE)")
    env = plugin_env(table_path, library_path)
    return {**env, PROFILER_ENV: str(library_path), TIMING_SAMPLE_ENV: str(sample), LEARNING_ARM_ENV: str(arm)}
