"""The ``node-name`` file: the name each host's agent registers as, keyed by the host it runs on.

Jobs on a host learn their node's name from it (``topo-tune env``'s default for ``--node``). A config
directory may be shared by several agents (one path on every host over a shared file system, or the demo's
agents on one machine), so the file holds one line per (host name, agent name): a host reads only its own
lines, so it can never take another host's name, and a host with two different agent names on it (two agents
sharing one config directory on one machine, or a renamed agent's old line) is ambiguous and refused with the
way out (``--node``) rather than answered with whichever agent wrote last. Lines are added under a lock on
the config directory and the file is replaced atomically.

Non-goals: where the file lives (``versions/layout.py``) and which identity a job prefers over it (Slurm's
``SLURMD_NODENAME`` and ``--node`` come first: ``cli/job.py``).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from topo_tune.errors import ConfigError
from topo_tune.versions.layout import NODE_NAME_FILE

_TEMPORARY = ".node-name.new"


def parse(text: str) -> list[tuple[str, str]]:
    """The (host, name) lines of the file, in order; a line without a host (written by an older agent, which
    recorded only a name) is left out: nothing says which host it belongs to."""
    entries: list[tuple[str, str]] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and (words[0], words[1]) not in entries:
            entries.append((words[0], words[1]))
    return entries


def render(entries: list[tuple[str, str]]) -> str:
    return "".join(f"{host} {name}\n" for host, name in entries)


def name_on_host(text: str, host: str, *, path: Path) -> str:
    """The agent name recorded for ``host`` ("" when none); two different names for it raise `ConfigError`."""
    names = [name for recorded_host, name in parse(text) if recorded_host == host]
    if len(names) > 1:
        raise ConfigError(
            "--node",
            f"{path} records {len(names)} agent names for host {host} ({', '.join(names)}): several agents share "
            "this config directory on one host; pass --node NAME (or set TOPO_TUNE_NODE_NAME)",
        )
    return names[0] if names else ""


def recorded_name(config_dir: Path, host: str) -> str:
    """The name ``host``'s agent recorded in ``config_dir`` ("" when the file or the host's line is missing)."""
    path = config_dir / NODE_NAME_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    return name_on_host(text, host, path=path)


def record(config_dir: Path, *, host: str, name: str) -> None:
    """Add the line (``host``, ``name``) to ``config_dir``'s file, keeping the other hosts' and agents' lines."""
    directory = os.open(config_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)  # another agent sharing the directory adds its line after this one
        target = config_dir / NODE_NAME_FILE
        try:
            entries = parse(target.read_text(encoding="utf-8"))
        except FileNotFoundError:
            entries = []
        if (host, name) in entries:
            return
        entries.append((host, name))
        temporary = config_dir / _TEMPORARY
        temporary.write_text(render(entries), encoding="utf-8")
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    finally:
        os.close(directory)  # releases the lock
