"""Config versions: the immutable, content-addressed unit that studies produce and rollouts apply.

A version is a small set of files (``nccl.conf`` and, where the study chose per-size settings, the tuner
plugin's ``nccl_tuner.conf``; a rank map and an ``NCCL_TOPO_FILE`` when needed). Its id is a hash of the
files alone, so the same settings always get the same id, wherever and whenever they were found; the
provenance (study, trials, NCCL version, topology fingerprint) travels beside it, not inside the hash.

``nccl.conf`` follows NCCL's own reading rules (``src/misc/param.cc``): one ``KEY=VALUE`` per line, ``#`` at
column 0 starts a comment, lines without ``=`` are ignored by NCCL, and the value is everything after the
first ``=``, untrimmed. Rendering therefore refuses values NCCL would read differently from what was meant
(leading/trailing spaces, newlines), rather than writing a file whose meaning drifts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from topo_tune.errors import ValidationError

NCCL_CONF = "nccl.conf"
TUNER_TABLE = "nccl_tuner.conf"
RANK_MAP = "rankmap.json"
TOPO_FILE = "topology.xml"
FILE_NAMES = frozenset({NCCL_CONF, TUNER_TABLE, RANK_MAP, TOPO_FILE})
"""The only file names a version may hold: nothing else is ever written into a node's config directory."""

MAX_FILE_BYTES = 1 << 20
_KEY = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")
_ID = re.compile(r"^cv-[0-9a-f]{16}$")


def version_id(files: Mapping[str, str]) -> str:
    """``cv-`` and 16 hex digits of the SHA-256 of the files, independent of their order."""
    canonical = json.dumps(sorted(files.items()), ensure_ascii=False, separators=(",", ":"))
    return "cv-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def is_version_id(value: str) -> bool:
    return bool(_ID.match(value))


@dataclass(frozen=True)
class ConfigVersion:
    files: Mapping[str, str]
    provenance: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_files(self.files)
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
        object.__setattr__(self, "provenance", MappingProxyType(dict(self.provenance)))

    @property
    def id(self) -> str:
        return version_id(self.files)

    def settings(self) -> dict[str, str]:
        """The ``KEY=VALUE`` settings of its ``nccl.conf`` (empty when it has none)."""
        return parse_nccl_conf(self.files.get(NCCL_CONF, ""))


def check_files(files: Mapping[str, str]) -> None:
    """Refuse unknown file names and oversized or malformed content; names the offending file."""
    for name, content in files.items():
        if name not in FILE_NAMES:
            raise ValidationError(
                f"files[{name!r}]", f"not a config file name; allowed: {', '.join(sorted(FILE_NAMES))}"
            )
        if len(content.encode()) > MAX_FILE_BYTES:
            raise ValidationError(f"files[{name!r}]", f"larger than {MAX_FILE_BYTES} bytes")
        if "\x00" in content:
            raise ValidationError(f"files[{name!r}]", "contains a NUL byte")
    if NCCL_CONF in files:
        parse_nccl_conf(files[NCCL_CONF], strict=True)


def render_nccl_conf(settings: Mapping[str, str], *, header: str = "") -> str:
    """An ``nccl.conf`` that NCCL reads back as exactly ``settings``."""
    lines = [f"# {line}" for line in header.splitlines()]
    for key in sorted(settings):
        value = settings[key]
        if not _KEY.match(key):
            raise ValidationError(key, "not an NCCL variable name")
        if value != value.strip() or "\n" in value or "\r" in value or not value:
            raise ValidationError(key, f"value {value!r} would not read back the same (empty, spaces or newline)")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def parse_nccl_conf(text: str, *, strict: bool = False) -> dict[str, str]:
    """What NCCL reads from ``text``. With ``strict``, lines NCCL would ignore or misread are errors."""
    settings: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            if strict:
                raise ValidationError(f"nccl.conf:{number}", "no '=' (NCCL ignores such a line)")
            continue
        if strict and not _KEY.match(key):
            raise ValidationError(f"nccl.conf:{number}", f"{key!r} is not an NCCL variable name")
        if strict and key in settings:
            raise ValidationError(f"nccl.conf:{number}", f"{key} set twice")
        settings.setdefault(key, value)  # NCCL's setenv(..., overwrite=0): the first value wins
    return settings
