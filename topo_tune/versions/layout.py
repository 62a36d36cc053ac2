"""Where a node keeps its config versions: the paths the agent writes and jobs read.

::

    <config dir>/versions/<version id>/nccl.conf   a staged version's files (immutable)
    <config dir>/active -> versions/<version id>    the node's active version
    <config dir>/jobs.lock                          running jobs hold a shared lock on it
    <config dir>/node-name                          "HOST NAME" lines: the name each host's agent registers as

The agent (``agent/config_store.py``) writes this layout; ``topo-tune env``/``exec`` point jobs at it. One
module holds it so neither side has to import the other. Non-goals: reading or writing the files.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIG_DIR = Path("/etc/nccl/topo-tune")
VERSIONS_DIR = "versions"
ACTIVE_LINK = "active"
JOBS_LOCK = "jobs.lock"
NODE_NAME_FILE = "node-name"


def staged_path(config_dir: Path, version: str, name: str) -> Path:
    """The path of file ``name`` of staged ``version``; a job pinned to the version reads it."""
    return config_dir / VERSIONS_DIR / version / name
