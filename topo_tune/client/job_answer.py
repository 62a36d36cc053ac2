"""A controller's answer about a job, checked before a launcher, a hostfile or a shell acts on it.

``env``, ``exec``, ``hostfile`` and the Slurm task prolog turn the node order and master address a controller
answers into hostfile lines, ``export`` lines and launcher flags. A controller reached on the plaintext path
(or anyone in between), or one whose stored pin was forged, could answer a node name with a newline (an extra
hostfile line), a space and a flag (``--master_addr=x --foo``), or a file name with ``..``. So the client
checks the answer as the controller checks a request: node names spelt as host names, the master address a host
name or an IP literal, the version an id, file names the version's known ones. A wrong answer is refused with
one line naming the controller and the field; nothing of it is written or run.

Non-goals: checking that the answer is true (that these nodes are the job's); the controller's own checks.
"""

from __future__ import annotations

import ipaddress
import re

from topo_tune.config.values import NODE_NAME_PATTERN, PATTERN_WORDS
from topo_tune.errors import UnsafeAnswer
from topo_tune.jobs.job_config import JobConfig
from topo_tune.versions.version import FILE_NAMES, is_version_id

_NODE_NAME = re.compile(NODE_NAME_PATTERN)
MAX_NAME = 253


def checked_job_config(config: JobConfig, *, controller: str) -> JobConfig:
    """``config`` as the controller at ``controller`` answered it, once every name in it is what it claims."""

    def refuse(field: str, value: str, why: str) -> UnsafeAnswer:
        return UnsafeAnswer(f"controller {controller} answered {field} = {value[:80]!a}: {why}")

    for field, names in (("node_order", config.node_order), ("nodes", config.nodes)):
        for i, name in enumerate(names):
            if len(name) > MAX_NAME or not _NODE_NAME.fullmatch(name):
                raise refuse(f"{field}[{i}]", name, f"not a node name ({PATTERN_WORDS[NODE_NAME_PATTERN]})")
    if config.master_addr and not _host(config.master_addr):
        raise refuse("master_addr", config.master_addr, "not a host name or an IP address")
    if config.config_version and not is_version_id(config.config_version):
        raise refuse("config_version", config.config_version, "not a config version id")
    for i, file_name in enumerate(config.files):
        if file_name not in FILE_NAMES:
            raise refuse(f"files[{i}]", file_name, f"not a config file name ({', '.join(sorted(FILE_NAMES))})")
    return config


def _host(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return len(value) <= MAX_NAME and _NODE_NAME.fullmatch(value) is not None
    return True
