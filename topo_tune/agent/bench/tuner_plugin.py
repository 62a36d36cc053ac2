"""The agent's tuner plugin for benchmark jobs that carry a candidate table.

A job with a ``tuner_table`` runs exactly as production will: NCCL loads topo-tune's plugin and reads the
table once per communicator. The agent, not the job, chooses both files: the library is the one installed
in the agent's plugin directories (the image builds it there), or, where none is installed, one the agent
builds once into its own state directory; the table is written into the agent's own table directory under
the job's id. Every rank of the job gets the same two variables, and every node the same table text (it
travels in the job's command). A job without a table gets an empty one (:meth:`TunerPluginStage.recording`):
NCCL decides as without a plugin, and the plugin records what NCCL offered and chose at every size.

Non-goals: validating the table (``topo_tune.benchmark.job_spec`` does, with the plugin's rules) and
deciding whether a table is worth running (the tuner's business).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.errors import PluginBuildError
from topo_tune.plugin import LIBRARY_FILE, PLUGIN_ENV, BuiltPlugin, build_plugin, plugin_env

__all__ = ["TunerPluginStage"]

logger = logging.getLogger(__name__)

_RECORD_ONLY_TABLE = "# no rows: NCCL decides; the plugin only records what it offered and chose\n"


class TunerPluginStage:
    """Turns a job with a candidate table into one whose environment points NCCL at the plugin and the table."""

    def __init__(
        self,
        *,
        installed_dirs: Sequence[Path],
        build_dir: Path,
        table_dir: Path,
        builder: Callable[[Path], BuiltPlugin] = build_plugin,
    ) -> None:
        self._installed_dirs = tuple(installed_dirs)
        self._build_dir = build_dir
        self._table_dir = table_dir
        self._builder = builder
        self._library: Path | None = None
        self._lock = threading.Lock()

    @property
    def plugin_dirs(self) -> tuple[Path, ...]:
        """Where the library may come from (the env policy's plugin directories must hold these)."""
        return (*self._installed_dirs, self._build_dir)

    @property
    def table_dir(self) -> Path:
        return self._table_dir

    def library(self) -> Path:
        """The installed library, else the one built here (once per agent process).

        Raises:
            ValueError: no library is installed and building one failed (the compiler's reason).
        """
        with self._lock:
            if self._library is None:
                installed = [d / LIBRARY_FILE for d in self._installed_dirs if (d / LIBRARY_FILE).is_file()]
                if installed:
                    self._library = installed[0].resolve()
                else:
                    try:
                        self._library = self._builder(self._build_dir).path
                    except PluginBuildError as exc:
                        raise ValueError(
                            f"tuner_table: no tuner plugin installed and building one failed: {exc}"
                        ) from exc
            return self._library

    def recording(self, spec: BenchmarkSpec, *, index: int = 0) -> BenchmarkSpec:
        """``spec`` (a job without a table) with the plugin and an empty table, so NCCL's choices are recorded.

        An empty table edits no cost entry and sets no channel count: NCCL decides as without a plugin. A job
        that names a tuner plugin of its own keeps it, and where no library is available the job runs
        unrecorded rather than fails (the record is a report, not a requirement).
        """
        if spec.tuner_table or PLUGIN_ENV in spec.env:
            return spec
        try:
            return self.staged(dataclasses.replace(spec, tuner_table=_RECORD_ONLY_TABLE), index=index)
        except ValueError as exc:
            logger.info("job %s runs without the tuner plugin's record: %s", spec.job_id, exc)
            return spec

    def staged(self, spec: BenchmarkSpec, *, index: int = 0) -> BenchmarkSpec:
        """``spec`` with its table written to the table directory and the two variables in its env.

        ``index``: which of its job's specs it is (each stages its own table, all before the first runs)."""
        if not spec.tuner_table:
            return spec
        library = self.library()
        self._table_dir.mkdir(parents=True, exist_ok=True)
        name = f"{spec.job_id}.{index}" if index else spec.job_id
        path = (self._table_dir / f"{name}.csv").resolve()
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(spec.tuner_table)
        os.replace(partial, path)  # a re-sent job rewrites the same content; ranks never see half a file
        return dataclasses.replace(spec, tuner_table="", env={**spec.env, **plugin_env(path, library)})
