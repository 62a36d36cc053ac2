"""topo-tune's NCCL tuner plugin: the C library that applies per-size choices inside NCCL, and its build.

The C source (``topotune_tuner.c``, ``nccl_tuner_abi.h``) ships as package data; :func:`build_plugin` compiles
it with the system C compiler, and :func:`plugin_env` gives the environment that makes NCCL load it with a
table. Non-goals: producing the table (the tuner renders it) and loading NCCL here.
"""

from topo_tune.errors import TunerTableError
from topo_tune.plugin.build import (
    LIBRARY_FILE,
    SOURCE_FILES,
    BuiltPlugin,
    PluginBuildError,
    build_plugin,
    find_compiler,
)
from topo_tune.plugin.job_env import PLUGIN_ENV, TABLE_ENV, plugin_env
from topo_tune.plugin.table import MAX_TABLE_BYTES, TunerRow, parse_tuner_table

__all__ = [
    "LIBRARY_FILE",
    "MAX_TABLE_BYTES",
    "PLUGIN_ENV",
    "SOURCE_FILES",
    "TABLE_ENV",
    "BuiltPlugin",
    "PluginBuildError",
    "TunerRow",
    "TunerTableError",
    "build_plugin",
    "find_compiler",
    "parse_tuner_table",
    "plugin_env",
]
