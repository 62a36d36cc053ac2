"""The environment that makes a job's NCCL load topo-tune's tuner plugin with a given table.

``topo-tune exec``/``env`` and the ``nccl`` benchmark backend merge :func:`plugin_env` into the rest of a
job's configuration. Both paths must be absolute: every rank resolves them in its own working directory.

Non-goals: choosing which table a job gets (that is the pinned config version's business) and checking the
table's contents (the plugin reports bad lines through NCCL's log).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PLUGIN_ENV", "TABLE_ENV", "plugin_env"]

PLUGIN_ENV = "NCCL_TUNER_PLUGIN"
"""NCCL's variable naming the tuner plugin (a name, a library file or a path)."""

TABLE_ENV = "NCCL_TUNER_CONFIG_FILE"
"""The variable the plugin reads its table path from (the same one NVIDIA's example plugin reads)."""


def plugin_env(table_path: Path, library_path: Path) -> dict[str, str]:
    """Return ``{NCCL_TUNER_PLUGIN: library_path, NCCL_TUNER_CONFIG_FILE: table_path}``.

    Raises:
        ValueError: a path is relative; the message names which.
    """
    for name, path in (("table_path", table_path), ("library_path", library_path)):
        if not path.is_absolute():
            raise ValueError(f"{name}: {str(path)!r} must be an absolute path, since every rank resolves it itself")
    return {PLUGIN_ENV: str(library_path), TABLE_ENV: str(table_path)}
