"""The value types of ``cluster.yaml``: durations, byte sizes, host:port, node names; parsed and shown.

A duration is seconds or a string with a unit (``500ms``, ``10s``, ``2m``, ``1h``, ``30d``); a size is bytes or a
string with a power-of-1024 unit (``64K``, ``16M``, ``1G``), as nccl-tests spells them; a backend is named by
its value (``nccl``, ``gloo``, ``sim``). ``show_duration`` and
``show_bytes`` write a value back the same way, for help texts.

Non-goal: the sections that use them (``config/cluster.py``).
"""

from __future__ import annotations

import re
from typing import Annotated

import pydantic
from pydantic import Field, PlainSerializer, WithJsonSchema

from topo_tune.ids import NodeName
from topo_tune.nccl.backends import Backend

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*\Z")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> object:
    """Seconds from ``10``, ``2.5``, ``"500ms"``, ``"10s"``, ``"2m"``, ``"1h"`` or ``"30d"``; anything else is
    left for pydantic to reject with its own message."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"expected a duration such as 10s, 500ms, 2m or 30d, got {value!r}")
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return value


Duration = Annotated[
    float,
    pydantic.BeforeValidator(parse_duration),
    Field(gt=0),
    pydantic.WithJsonSchema(
        {
            "oneOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": r"^\d+(\.\d+)?(ms|s|m|h|d)?$"},
            ],
            "description": "seconds, or a string with a unit: 500ms, 10s, 2m, 1h, 30d",
        }
    ),
]

HOST_PORT_PATTERN = r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-]+):\d{1,5}$"
HostPort = Annotated[str, Field(pattern=HOST_PORT_PATTERN, description="HOST:PORT")]

NODE_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9\-_.]{0,251}[A-Za-z0-9])?$"
PATTERN_WORDS = {
    HOST_PORT_PATTERN: "expected HOST:PORT, e.g. 127.0.0.1:50051",
    NODE_NAME_PATTERN: "expected a host name (RFC 1123: letters, digits, '-', '_' and '.', beginning and ending "
    "with a letter or digit)",
}
"""What a value must look like, in words, for each pattern a setting is checked against (errors never show
the regular expression)."""

# RFC 1123 host names, which Kubernetes node names also are.
_HOST_NAME = Field(
    min_length=1,
    max_length=253,
    pattern=NODE_NAME_PATTERN,
    description="a host name (RFC 1123), as the node's agent registers it",
)
HostName = Annotated[str, _HOST_NAME]
"""A name spelt as a host name: a rack's, the cluster's."""
NodeNameSetting = Annotated[NodeName, _HOST_NAME]
"""A node's name in cluster.yaml: a :data:`~topo_tune.ids.NodeName`, checked as a host name."""

BackendName = Annotated[
    Backend,
    WithJsonSchema({"enum": [b.value for b in Backend], "title": "Backend", "type": "string"}),
    PlainSerializer(lambda backend: backend.value, return_type=str),
]
"""cluster.yaml's ``backend``: a :class:`~topo_tune.nccl.backends.Backend`, read and written as its value."""

_BYTES = re.compile(r"^\s*(\d+)\s*([KMG]?)i?B?\s*\Z", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(value: object) -> object:
    """Bytes from ``4096``, ``"64K"``, ``"16M"``, ``"1G"`` (powers of 1024, like nccl-tests)."""
    if isinstance(value, str):
        match = _BYTES.match(value)
        if match is None:
            raise ValueError(f"expected a size such as 256, 64K, 16M or 1G, got {value!r}")
        return int(match.group(1)) * _BYTE_UNITS[match.group(2).upper()]
    return value


ByteSize = Annotated[
    int,
    pydantic.BeforeValidator(parse_bytes),
    Field(ge=1, le=16 << 30),
    pydantic.WithJsonSchema(
        {
            "oneOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": r"^\d+[KMGkmg]?(i?B)?$"},
            ],
            "description": "bytes, or a size with a unit: 64K, 16M, 1G",
        }
    ),
]


def show_duration(seconds: float) -> str:
    """``21600.0`` → ``6h``, ``0.5`` → ``500ms``: the largest unit that writes the value whole."""
    for unit in ("d", "h", "m", "s"):
        count = seconds / _UNIT_SECONDS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds * 1000:g}ms"


def show_bytes(size: int) -> str:
    """``1048576`` → ``1M``, ``1000`` → ``1000``: the largest power-of-1024 unit that writes the size whole."""
    for unit in ("G", "M", "K"):
        if size >= _BYTE_UNITS[unit] and size % _BYTE_UNITS[unit] == 0:
            return f"{size // _BYTE_UNITS[unit]}{unit}"
    return str(size)
