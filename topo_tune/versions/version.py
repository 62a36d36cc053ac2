"""Config versions: the immutable, content-addressed unit that studies produce and rollouts apply.

A version is a small set of files (``nccl.conf`` and, where the study chose per-size settings, the tuner
plugin's ``nccl_tuner.conf``, beside it up to ``MAX_CHALLENGERS`` challenger tables when learning is on
(``docs/learning.md``); a rank map and an ``NCCL_TOPO_FILE`` when needed). Its id is a hash of the files
alone, so the same settings always get the same id, wherever and whenever they were found; the provenance
(study, trials, NCCL version, topology fingerprint) travels beside it, not inside the hash.

``nccl.conf`` follows NCCL's own reading rules (``src/misc/param.cc``, :func:`parse_nccl_conf`): one
``KEY=VALUE`` per ``\n``-ended line, ``#`` at column 0 starts a comment, lines without ``=`` are ignored by
NCCL, and the value is everything after the first ``=``, untrimmed. Rendering therefore refuses values NCCL
would read differently from what was meant (leading/trailing spaces, line breaks), rather than writing a file
whose meaning drifts, and a version's ``nccl.conf`` may set only what the env policy allows in a version.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypeGuard

from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.errors import EnvPolicyError, ValidationError
from topo_tune.ids import ConfigVersionId

NCCL_CONF = "nccl.conf"
TUNER_TABLE = "nccl_tuner.conf"
RANK_MAP = "rankmap.json"
TOPO_FILE = "topology.xml"
MAX_CHALLENGERS = 4
"""The most challenger tables a version carries beside its chosen one (``docs/learning.md``)."""


def challenger_table(index: int) -> str:
    """The file name of a version's ``index``-th challenger table (1-based: arm ``index`` runs it)."""
    return f"nccl_tuner.challenger-{index}.conf"


CHALLENGER_TABLES = tuple(challenger_table(i) for i in range(1, MAX_CHALLENGERS + 1))
_OWN_FILES = (NCCL_CONF, TUNER_TABLE, RANK_MAP, TOPO_FILE)
FILE_NAMES = frozenset({*_OWN_FILES, *CHALLENGER_TABLES})
"""The only file names a version may hold: nothing else is ever written into a node's config directory."""


def challenger_count(names: Collection[str]) -> int:
    """How many challenger tables a version with these file names carries (they are numbered from 1)."""
    return sum(1 for name in CHALLENGER_TABLES if name in names)


MAX_FILE_BYTES = 1 << 20
SYSTEM_NCCL_CONF = Path("/etc/nccl.conf")
"""The file NCCL always reads after ``NCCL_CONF_FILE`` (``src/misc/param.cc``); no variable turns it off."""
_LINE_BYTES = 4095  # fgets(line, 4096, file) reads at most 4095 bytes per call
_FIELD_BYTES = 1023  # char envVar[1024], envValue[1024]
_KEY = re.compile(r"^[A-Z][A-Z0-9_]{0,127}\Z")
_ID = re.compile(r"^cv-[0-9a-f]{16}\Z")


def version_id(files: Mapping[str, str]) -> ConfigVersionId:
    """``cv-`` and 16 hex digits of the SHA-256 of the files, independent of their order."""
    canonical = json.dumps(sorted(files.items()), ensure_ascii=False, separators=(",", ":"))
    return ConfigVersionId("cv-" + hashlib.sha256(canonical.encode()).hexdigest()[:16])


def is_version_id(value: str) -> TypeGuard[ConfigVersionId]:
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
    def id(self) -> ConfigVersionId:
        return version_id(self.files)

    @property
    def challengers(self) -> int:
        """How many challenger tables it carries beside its chosen ``nccl_tuner.conf`` (``docs/learning.md``)."""
        return challenger_count(self.files)

    def settings(self) -> dict[str, str]:
        """The ``KEY=VALUE`` settings of its ``nccl.conf`` (empty when it has none)."""
        return parse_nccl_conf(self.files.get(NCCL_CONF, ""))


def check_files(files: Mapping[str, str]) -> None:
    """Refuse unknown file names and oversized or malformed content; names the offending file."""
    for name, content in files.items():
        if name not in FILE_NAMES:
            raise ValidationError(
                f"files[{name!r}]",
                f"not a config file name; allowed: {', '.join(sorted(_OWN_FILES))}, "
                f"{challenger_table(1).replace('1', 'N')} (N 1 to {MAX_CHALLENGERS})",
            )
        if len(content.encode()) > MAX_FILE_BYTES:
            raise ValidationError(f"files[{name!r}]", f"larger than {MAX_FILE_BYTES} bytes")
        if "\x00" in content:
            raise ValidationError(f"files[{name!r}]", "contains a NUL byte")
    carried = challenger_count(files)
    if carried and TUNER_TABLE not in files:
        raise ValidationError(f"files[{challenger_table(1)!r}]", f"a challenger table needs a chosen {TUNER_TABLE}")
    if any(challenger_table(i) not in files for i in range(1, carried + 1)):
        missing = next(challenger_table(i) for i in range(1, carried + 1) if challenger_table(i) not in files)
        raise ValidationError(f"files[{missing!r}]", "challenger tables are numbered from 1 without a gap")
    if NCCL_CONF in files:
        check_settings(parse_nccl_conf(files[NCCL_CONF], strict=True))
    if RANK_MAP in files:
        check_rank_map(files[RANK_MAP])


MAX_RANK_MAP_DEPTH = 8
"""Deepest nesting of a rank map's arrays and objects (the tuner writes 4: map, ring, edges, edge)."""
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_NESTING = re.compile(r"[\[\]{}]")
_RANK_MAP_KEYS = frozenset({"version", "method", "world_size", "planned", "naive", "ranks", "pairs", "pair_matrix"})
_RING_KEYS = frozenset({"node_order", "ring_bottleneck_gbps", "ring_latency_us", "edges"})


def _json_depth(text: str) -> int:
    """How deeply ``text``'s arrays and objects nest, counted without parsing (strings left out)."""
    depth = most = 0
    for match in _JSON_NESTING.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if match.group() in "[{" else -1
        most = max(most, depth)
    return most


def check_rank_map(text: str) -> None:
    """Refuse a ``rankmap.json`` that is not the rank map the tuner writes (``tuner/ring/rank_map.py``).

    The agent stages it for jobs and the gates read its ring order, so a node must never activate one it
    cannot read: nesting is bounded before parsing (100,000 levels would overflow a parser's stack), then
    the shape is checked: version 1, ``planned.node_order`` a list of distinct node names, known keys only.
    """
    where = f"files[{RANK_MAP!r}]"
    if _json_depth(text) > MAX_RANK_MAP_DEPTH:
        raise ValidationError(where, f"nested more than {MAX_RANK_MAP_DEPTH} levels deep; not a rank map")
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ValidationError(where, f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValidationError(where, f"a rank map is a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - _RANK_MAP_KEYS)
    if unknown:
        raise ValidationError(
            f"{RANK_MAP}:{unknown[0]}", f"not a rank map key; known: {', '.join(sorted(_RANK_MAP_KEYS))}"
        )
    if data.get("version") != 1:
        raise ValidationError(f"{RANK_MAP}:version", f"must be 1, got {data.get('version')!r}")
    if not isinstance(data.get("planned"), dict):
        raise ValidationError(f"{RANK_MAP}:planned", "required: an object with node_order")
    for ring in ("planned", "naive"):
        if ring in data:
            _check_ring(data[ring], f"{RANK_MAP}:{ring}")
    ranks = data.get("ranks", [])
    if not isinstance(ranks, list) or not all(
        isinstance(r, dict) and isinstance(r.get("node"), str) and type(r.get("rank")) is int for r in ranks
    ):
        raise ValidationError(f"{RANK_MAP}:ranks", "a list of {rank, node, local_rank} objects")
    if "pair_matrix" in data:
        # Jobs' node orders are planned on it: the reader they are planned with checks every row and number
        # (imported here only: the agent and admin commands that never meet a rank map skip NumPy).
        from topo_tune.versions.ring import read_rank_map  # noqa: PLC0415

        read_rank_map(text)


def _check_ring(ring: object, where: str) -> None:
    if not isinstance(ring, dict):
        raise ValidationError(where, "an object with node_order")
    unknown = sorted(set(ring) - _RING_KEYS)
    if unknown:
        raise ValidationError(f"{where}.{unknown[0]}", f"not a ring key; known: {', '.join(sorted(_RING_KEYS))}")
    order = ring.get("node_order")
    if not isinstance(order, list) or not all(isinstance(n, str) and 0 < len(n) <= 253 for n in order):
        raise ValidationError(f"{where}.node_order", "required: a list of node names")
    if len(set(order)) != len(order):
        raise ValidationError(f"{where}.node_order", "names a node twice")


def check_settings(settings: Mapping[str, str], *, config_dir: Path | None = None) -> None:
    """Refuse ``nccl.conf`` variables the env policy refuses in a config version, and anything not ``NCCL_*``.

    The same policy (``benchmark/env_policy.py``) checks a version when it is pushed, when a rollout gates
    it and when a node applies it; only the node knows its ``config_dir``, so file paths are checked
    against it there and only for their form before. Only NCCL reads ``nccl.conf``, so only ``NCCL_*``
    variables mean anything in it.
    """
    for key in settings:
        if not key.startswith("NCCL_"):
            raise ValidationError(f"nccl.conf:{key}", "only NCCL_* variables belong in nccl.conf")
    policy = EnvPolicy(node_paths=False) if config_dir is None else EnvPolicy(config_dirs=(config_dir,))
    try:
        policy.check_config(settings)
    except EnvPolicyError as error:
        first = error.violations[0]
        raise ValidationError(f"nccl.conf:{first.key}", first.reason) from None


def render_nccl_conf(settings: Mapping[str, str], *, header: str = "") -> str:
    """An ``nccl.conf`` that NCCL reads back as exactly ``settings``."""
    lines = [f"# {line}" for line in header.splitlines()]
    for key in sorted(settings):
        value = settings[key]
        if not _KEY.match(key):
            raise ValidationError(key, "not an NCCL variable name")
        if value != value.strip() or not value or any(c in value for c in "\n\r\0"):
            raise ValidationError(key, f"value {value!r} would not read back the same (empty, spaces or newline)")
        if len(value.encode()) > _FIELD_BYTES:
            raise ValidationError(key, f"value longer than NCCL's {_FIELD_BYTES} bytes")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def nccl_conf_lines(text: str) -> list[tuple[int, bytes]]:
    """The lines NCCL's ``setEnvFile`` sees in ``text``, numbered from 1, without their line ending.

    NCCL reads with ``fgets`` into a 4096-byte buffer: a line ends only at ``\n`` (no other character
    breaks a line), a longer line is read in 4095-byte pieces that each count as a line, one trailing
    ``\n`` and then one ``\r`` are removed, and the line stops at a NUL (C strings).
    """
    data = text.encode("utf-8", "surrogateescape")
    lines: list[tuple[int, bytes]] = []
    position = 0
    while position < len(data):
        newline = data.find(b"\n", position, position + _LINE_BYTES)
        end = position + min(_LINE_BYTES, len(data) - position) if newline < 0 else newline + 1
        line = data[position:end].removesuffix(b"\n").removesuffix(b"\r")
        lines.append((len(lines) + 1, line.split(b"\0", 1)[0]))
        position = end
    return lines


def parse_nccl_conf(text: str, *, strict: bool = False) -> dict[str, str]:
    """What NCCL reads from ``text``. With ``strict``, lines NCCL would ignore or misread are errors.

    Lenient, it reads exactly as NCCL 2.30 does (``src/misc/param.cc``): see :func:`nccl_conf_lines`; ``#``
    at column 0 starts a comment, a line without ``=`` is skipped, the key and the value (everything after
    the first ``=``) are cut at 1023 bytes, and the first value of a key wins (``setenv(..., 0)``). Strict,
    it also refuses what NCCL versions read differently or what reads back other than it looks: a ``\r``
    (kept in the value before 2.30), a line NCCL would split, a key or value NCCL would cut.
    """
    settings: dict[str, str] = {}
    if strict and "\r" in text:
        raise ValidationError("nccl.conf", "contains a carriage return (NCCL before 2.30 keeps it in the value)")
    for number, raw in nccl_conf_lines(text):
        if strict and len(raw) >= _LINE_BYTES:
            raise ValidationError(f"nccl.conf:{number}", f"{_LINE_BYTES} bytes or more: NCCL reads the rest as a line")
        if raw.startswith(b"#"):
            continue
        raw_key, sep, raw_value = raw.partition(b"=")
        if not sep:
            if strict and raw:
                raise ValidationError(f"nccl.conf:{number}", "no '=' (NCCL ignores such a line)")
            continue
        if strict and max(len(raw_key), len(raw_value)) > _FIELD_BYTES:
            raise ValidationError(f"nccl.conf:{number}", f"a key or value longer than NCCL's {_FIELD_BYTES} bytes")
        key = raw_key[:_FIELD_BYTES].decode("utf-8", "surrogateescape")
        value = raw_value[:_FIELD_BYTES].decode("utf-8", "surrogateescape")
        if strict and not _KEY.match(key):
            raise ValidationError(f"nccl.conf:{number}", f"{key!r} is not an NCCL variable name")
        if strict and key in settings:
            raise ValidationError(f"nccl.conf:{number}", f"{key} set twice")
        if key:  # setenv refuses an empty name
            settings.setdefault(key, value)  # NCCL's setenv(..., overwrite=0): the first value wins
    return settings


def file_settings(environ: Mapping[str, str], *, system_conf: Path = SYSTEM_NCCL_CONF) -> dict[str, str]:
    """What NCCL's ``initEnv`` adds to ``environ`` from its files: keys they set that ``environ`` does not.

    NCCL reads ``$NCCL_CONF_FILE`` (or ``$HOME/.nccl.conf`` when that is unset or empty) and then, always,
    ``/etc/nccl.conf``; the environment wins over both and the first file over the second. Setting
    ``NCCL_CONF_FILE`` therefore does not keep ``/etc/nccl.conf`` out: its keys fill whatever the environment
    and the first file leave unset. An unreadable file is skipped, as NCCL does.
    """
    first = environ.get("NCCL_CONF_FILE") or (f"{environ['HOME']}/.nccl.conf" if environ.get("HOME") else "")
    added: dict[str, str] = {}
    for path in (Path(first) if first else None, system_conf):
        if path is None:
            continue
        try:
            text = path.read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            continue
        for key, value in parse_nccl_conf(text).items():
            if key not in environ and key not in added:
                added[key] = value
    return added
